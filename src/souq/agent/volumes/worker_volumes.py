"""A worker's volumes: the source of truth for them is this worker's state file and disk.

A volume is a row of the ``volumes`` table (:mod:`souq.agent.volumes.rows`) and a directory,
``<data_dir>/volumes/<id>``. Its ``size_gb`` is reserved in the worker's disk ledger
(:class:`~souq.agent.capacity.admission.Admission`) from create to destroy, like a machine's
``guest.disk_mb``: offers show the disk it takes, and a create or extend that does not fit is
refused. Where the agent can (root, loop devices, ext4 tools: :mod:`souq.agent.volumes.disks`)
the directory is the mount point of a filesystem of exactly that size, so a write past it fails
as on a full disk; elsewhere what the files use is only counted when a volume is read
(``used_mb``), not capped (see docs/volumes.md).

A machine attaches a volume when it is claimed (:meth:`AgentVolumes.check_mounts` before the
claim, :meth:`AgentVolumes.attach` after), one machine at a time, and lets go of it when it is
destroyed (:meth:`AgentVolumes.detach`). At a restart :meth:`AgentVolumes.reconcile` repairs
what a crash between two of those transactions left (a claim recorded, its attach not yet),
and finishes destroys that were half done.

Snapshots are ``tar.gz`` archives of the directory, kept on the worker under
``<data_dir>/volumes/.snapshots/<volume>/`` until the volume is destroyed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import tarfile
from collections.abc import Iterable
from pathlib import Path

from souq.agent.capacity.admission import Admission
from souq.agent.state.records import MachineRow
from souq.agent.state.store import Store
from souq.agent.volumes.disks import VolumeDisks
from souq.agent.volumes.rows import VolumeRow, VolumeRows
from souq.clock import Clock, iso_from_ms
from souq.errors import (
    InsufficientCapacity,
    InvalidInput,
    NotFound,
    Unavailable,
    VolumeAttached,
)
from souq.model.base import copy_fields
from souq.model.machine import MachineConfig, MachineState
from souq.model.resources import Resources
from souq.model.volume import (
    GB_MB,
    ExtendVolumeResponse,
    Volume,
    VolumeCreateCommand,
    VolumeEvent,
    VolumeSnapshot,
    VolumeState,
    new_volume_id,
    transition,
)

__all__ = ["AgentVolumes", "HostMount"]

log = logging.getLogger(__name__)

SNAPSHOTS = ".snapshots"
HostMount = tuple[str, str, str]  # (the directory on the host, the path it is seen at, name)


def _disk(size_gb: int) -> Resources:
    return Resources(cpus=0, memory_mb=0, disk_mb=size_gb * GB_MB)


def used_mb(root: Path) -> int:
    """What the files under ``root`` take (apparent sizes, links not followed), in MiB; the
    ``lost+found`` of a volume's own filesystem is the filesystem's, not counted."""
    total = 0
    for folder, dirs, files in os.walk(root):
        if folder == str(root) and "lost+found" in dirs and os.path.ismount(root):
            dirs.remove("lost+found")
        for name in files + dirs:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return -(-total // (1024 * 1024))


class AgentVolumes:
    def __init__(
        self,
        store: Store,
        root: Path,
        admission: Admission,
        clock: Clock,
        *,
        worker_id: str,
        disks: VolumeDisks | None = None,
    ) -> None:
        self.rows = VolumeRows(store)
        self.root = root
        self._admission = admission
        self._clock = clock
        self.worker_id = worker_id
        self._requests: dict[str, str] = {}  # create request id -> volume id (this run)
        # A filesystem of its size for each volume where the host allows (the agent's own), or
        # plain directories (disks=None: nothing mounted, as a unit test of the rules wants).
        self.disks = disks or VolumeDisks(root, enabled=False)

    # -- the records -----------------------------------------------------------------------

    def volume(self, row: VolumeRow, *, measure: bool = False) -> Volume:
        return copy_fields(
            Volume,
            row,
            zone=self.worker_id,
            worker_id=self.worker_id,
            created_at=iso_from_ms(row.created_at),
            used_mb=used_mb(row.dir) if measure and row.dir.is_dir() else None,
        )

    def row(self, app: str, volume_id: str) -> VolumeRow:
        row = self.rows.get(volume_id)
        if row is None or row.app != app:
            raise NotFound(
                f"volume {volume_id} not found in app {app}",
                hint=f"list the app's volumes with `souq volume list --app {app}`",
            )
        return row

    def list_volumes(self, app: str | None, *, include_destroyed: bool = False) -> list[Volume]:
        return [self.volume(r) for r in self.rows.all(app=app, live=not include_destroyed)]

    def get(self, app: str, volume_id: str) -> Volume:
        return self.volume(self.row(app, volume_id), measure=True)

    # -- create, change, destroy -----------------------------------------------------------

    def create(self, cmd: VolumeCreateCommand) -> Volume:
        """Reserve the disk and record the volume (refused like a claim: ``wrong_region``,
        ``cordoned``, ``insufficient_disk``), then make its directory."""
        made = self._requests.get(cmd.request_id)
        if made is not None and (row := self.rows.get(made)) is not None:
            return self.volume(row)
        now = self._clock.now_ms()
        want = _disk(cmd.size_gb)
        self._admission.check_hold(cmd.region, want, now)  # region, cordon, room: as a claim
        volume_id = new_volume_id(self.worker_id)
        row = copy_fields(
            VolumeRow,
            cmd,
            id=volume_id,
            state=VolumeState.CREATED,
            attached_machine_id=None,
            created_at=now,
            updated_at=now,
            dir=self.root / volume_id,
        )
        self.rows.insert(row)
        self._admission.reserve(want)
        self.disks.make(row.id, row.dir, row.size_gb)
        self._requests[cmd.request_id] = volume_id
        log.info("volume %s (%s, %d GB) created for app %s", row.id, row.name, row.size_gb, row.app)
        return self.volume(row)

    def update(self, app: str, volume_id: str, snapshot_retention: int | None) -> Volume:
        row = self.row(app, volume_id)
        transition(row.state, VolumeEvent.UPDATE, volume_id=row.id)
        if snapshot_retention is not None:
            self.rows.set(row.id, self._clock.now_ms(), snapshot_retention=snapshot_retention)
        return self.get(app, volume_id)

    def extend(self, app: str, volume_id: str, size_gb: int) -> ExtendVolumeResponse:
        """Grow the volume to ``size_gb`` (larger than now, and fitting beside what the worker
        has promised): its reservation, and its filesystem (:meth:`VolumeDisks.grow`: a machine
        using it may need a restart to see the room)."""
        row = self.row(app, volume_id)
        transition(row.state, VolumeEvent.EXTEND, volume_id=row.id)
        if size_gb <= row.size_gb:
            raise InvalidInput(
                f"size_gb: volume {row.id} is {row.size_gb} GB; extend it to more than that",
                hint="volumes grow only",
            )
        grow = _disk(size_gb - row.size_gb)
        short = self._admission.shortfall(grow, self._clock.now_ms())
        if short is not None:
            raise InsufficientCapacity(
                f"volume {row.id} cannot grow to {size_gb} GB on worker {self.worker_id}: "
                f"{short.detail}",
                hint="extend it by less, or free disk on its worker",
                details={"reason": short.reason},
            )
        restart = self.disks.grow(
            row.id, row.dir, size_gb, in_use=row.attached_machine_id is not None
        )
        self.rows.set(row.id, self._clock.now_ms(), size_gb=size_gb)
        self._admission.reserve(grow)
        return ExtendVolumeResponse(volume=self.get(app, volume_id), needs_restart=restart)

    def destroy(self, app: str, volume_id: str) -> Volume:
        """Refused while a machine has it attached; else its files, snapshots and reservation
        go. The row stays, ``destroyed``."""
        row = self.row(app, volume_id)
        if row.state is VolumeState.DESTROYED:
            return self.volume(row)
        if row.attached_machine_id is not None:
            raise VolumeAttached(
                f"volume {row.id} is attached to machine {row.attached_machine_id}",
                hint="destroy that machine first (its volume stays), then the volume",
                details={"machine_id": row.attached_machine_id},
            )
        self.rows.set(
            row.id,
            self._clock.now_ms(),
            state=transition(row.state, VolumeEvent.DESTROY, volume_id=row.id),
        )
        return self._remove(self.rows.get(row.id) or row)

    def _remove(self, row: VolumeRow) -> Volume:
        self.disks.remove(row.id, row.dir)
        shutil.rmtree(row.dir, ignore_errors=True)
        shutil.rmtree(self.root / SNAPSHOTS / row.id, ignore_errors=True)
        state = transition(row.state, VolumeEvent.REMOVED, volume_id=row.id)
        self.rows.set(row.id, self._clock.now_ms(), state=state)
        self._admission.release(_disk(row.size_gb))
        log.info("volume %s destroyed", row.id)
        return self.volume(self.rows.get(row.id) or row)

    # -- machines --------------------------------------------------------------------------

    def check_mounts(self, app: str, config: MachineConfig, machine_id: str | None = None) -> None:
        """Raise unless every volume ``config`` mounts is here, the app's, live and free (or
        already ``machine_id``'s)."""
        for mount in config.mounts:
            if mount.volume is None:
                raise InvalidInput(
                    f"mounts[].name {mount.name!r}: the broker names the volume by id",
                    hint="give mounts[].volume",
                )
            row = self.rows.get(mount.volume)
            if row is None or row.app != app or row.state is not VolumeState.CREATED:
                raise NotFound(
                    f"mounts[].volume: volume {mount.volume} not found in app {app} on worker "
                    f"{self.worker_id}",
                    hint=f"list the app's volumes with `souq volume list --app {app}`",
                )
            if row.attached_machine_id not in (None, machine_id):
                raise VolumeAttached(
                    f"mounts[].volume: volume {row.id} is attached to machine "
                    f"{row.attached_machine_id}",
                    hint="a volume is mounted by one machine at a time: destroy that machine, "
                    "or create another volume",
                    details={"machine_id": row.attached_machine_id, "volume_id": row.id},
                )

    def attach(self, machine_id: str, config: MachineConfig) -> None:
        """The volumes ``config`` mounts are ``machine_id``'s now; any other it held is free."""
        now = self._clock.now_ms()
        wanted = {m.volume for m in config.mounts if m.volume is not None}
        for row in self.rows.attached_to(machine_id):
            if row.id not in wanted:
                self.rows.attach(row.id, None, now)
        for volume_id in wanted:
            if not self.rows.attach(volume_id, machine_id, now):
                log.warning(
                    "volume %s is another machine's: %s not attached", volume_id, machine_id
                )

    def detach(self, machine_id: str) -> None:
        for row in self.rows.attached_to(machine_id):
            self.rows.attach(row.id, None, self._clock.now_ms())

    def host_mounts(self, config: MachineConfig) -> tuple[HostMount, ...]:
        """Where each mounted volume's files are on this host, and the path the machine sees."""
        out = []
        for mount in config.mounts:
            row = self.rows.get(mount.volume or "")
            if row is not None and row.state is VolumeState.CREATED:
                self.disks.ready(row.id, row.dir)
                out.append((str(row.dir), mount.path, row.name))
        return tuple(out)

    def unmount_all(self) -> None:
        """Unmount every volume's filesystem (``--stop-machines-on-exit``: its machines went
        with the agent); the next use mounts it again."""
        for row in self.rows.all():
            with contextlib.suppress(Unavailable):
                self.disks.unmount(row.dir)

    def reconcile(self, machines: Iterable[MachineRow]) -> None:
        """After a restart: attachments as the machines say, half-done destroys finished."""
        live = {m.id: m for m in machines if m.state is not MachineState.DESTROYED}
        now = self._clock.now_ms()
        for row in self.rows.all():
            holder = row.attached_machine_id
            if holder is not None and holder not in live:
                self.rows.attach(row.id, None, now)
            if row.state is VolumeState.DESTROYING:
                self._remove(self.rows.get(row.id) or row)
        for machine in live.values():
            for mount in machine.config.mounts:
                if mount.volume is not None:
                    self.rows.attach(mount.volume, machine.id, now)

    # -- snapshots -------------------------------------------------------------------------

    async def snapshot(self, app: str, volume_id: str) -> VolumeSnapshot:
        """Archive the volume's files now (``tar.gz``, kept on the worker)."""
        row = self.row(app, volume_id)
        transition(row.state, VolumeEvent.SNAPSHOT, volume_id=row.id)
        now = self._clock.now_ms()
        snap_id = f"vs_{now:012x}{os.urandom(3).hex()}"
        folder = self.root / SNAPSHOTS / row.id
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        archive = folder / f"{snap_id}.tar.gz"
        digest = await asyncio.to_thread(_archive, row.dir, archive)
        snap = VolumeSnapshot(
            id=snap_id,
            size=archive.stat().st_size,
            volume_size=row.size_gb * GB_MB * 1024 * 1024,
            digest=digest,
            created_at=iso_from_ms(now),
            retention_days=row.snapshot_retention,
        )
        (folder / f"{snap_id}.json").write_text(snap.model_dump_json())
        return snap

    def snapshots(self, app: str, volume_id: str) -> list[VolumeSnapshot]:
        row = self.row(app, volume_id)
        folder = self.root / SNAPSHOTS / row.id
        out = []
        for meta in sorted(folder.glob("*.json")) if folder.is_dir() else ():
            with contextlib.suppress(OSError, ValueError):
                out.append(VolumeSnapshot.model_validate(json.loads(meta.read_text())))
        return out


def _archive(source: Path, archive: Path) -> str:
    """``source`` as a ``tar.gz`` at ``archive`` (symbolic links kept as links); its sha256."""
    partial = archive.with_suffix(".partial")
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(source, arcname=".", recursive=True)
    h = hashlib.sha256()
    with partial.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    partial.replace(archive)
    return "sha256:" + h.hexdigest()
