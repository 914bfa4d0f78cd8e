"""Sandboxes made ahead of their machines: a warm slot per image, as serverless platforms keep.

Most of a sandboxed start is not the machine's: a uid, the machine's root (an idmapped mount
and an overlay, :mod:`souq.drivers.rootfs`), a waiter and ``bwrap``'s own setup (five
namespaces, its mounts, ``pivot_root``). None of it depends on which machine it is for. So
after a machine of an image starts, the driver makes the next one's sandbox in a thread of
its own, up to the point where only the machine is missing:

1. a uid taken for the slot (``warm-<agent pid>-<n>``, :mod:`souq.drivers.identity`), and the
   slot's root mounted for it under ``.rootfs/<slot>`` with a writable layer of its own;
2. a souq-waiter started in a spare cgroup (:mod:`souq.drivers.cgroups`, v1) with a second
   job pipe (``souq-waiter 3 NOFILE 4``), given a first job that runs ``bwrap``, as the
   slot's uid, with the machine's command line (:func:`souq.drivers.sandbox.bwrap_argv`) but
   for the command: the waiter's own static binary, ``/proc/self/fd/4 stub``, which waits
   inside the sandbox, as the command would run, for its command on a socket (waiter.c); the
   slot is ready once the stub says it runs.

A claim whose machine fits a slot (a fresh machine of that image, the same user inside and
network, no volumes) takes it: the slot's uid is handed to
the machine (recorded with it, the registry's file names it), its root's directory renamed to
the machine's (the mounts under it move with it), its spare cgroup renamed to the machine's
and limited; then the waiter gets the machine's exit file and log, and the stub its command,
working directory and environment, and ``exec``s it. From there the machine is like any
other: the waiter is its parent, ``bwrap`` the process the agent watches and records, and a
later agent re-adopts it the same way. A claim that fits no slot starts cold, as before.

A slot holds nothing of a machine: its uid is used by no machine, its layer is empty, its
sandbox runs nothing but the stub, blocked in a read. If the agent goes away, the waiter reads
end of file on its machine pipe and kills the sandbox; the next agent removes what is left
(:meth:`WarmSandboxes.sweep`). A slot's image files are checked at the take: an image unpacked
again since (another inode) is not the one the slot mounted.

**A machine of the private network** has a network namespace of its own, which its sandbox
joins (the waiter's ``n:`` entry) and its address in it: its slot cannot be made without
knowing which machine it is for. So such a slot is made *ahead of its claim*, for a machine id
chosen for it (:mod:`souq.agent.machines.network_slots` keeps them, one per network and image,
and takes the address and makes the namespace, its links, routes and rules: ``prepare``, run
first in the maker's thread); its key names the namespace (and the ``resolv.conf`` bound
over the image's), so only that machine fits it: :meth:`WarmSandboxes.keep` with ``ahead``,
never the "next machine's" slot after a start. A claim that takes it uses its machine id; if
its machine does not fit the slot after all (another image, user or working directory), the
slot is given up at the spawn and the machine starts cold, in the namespace made for it.

On cgroup v2 (no spare cgroups to rename) or without a static souq-waiter (an image's root has
none of the host's libraries), there are no slots.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from souq.drivers import processes, rootfs, sandbox
from souq.drivers.base import Handle, MachineSpec, SpawnError
from souq.drivers.cgroups import WAITERS, CgroupEntry, V1Backend
from souq.drivers.programs import DEFAULT_PATH
from souq.drivers.users import MachineUser
from souq.drivers.waiter import is_static
from souq.drivers.waiter_pool import IdleWaiter

if TYPE_CHECKING:
    from souq.drivers.cgroups import Cgroups
    from souq.drivers.exec import ExecDriver
    from souq.drivers.identity import MachineIds

__all__ = ["SLOT_PREFIX", "Key", "Slot", "WarmSandboxes"]

log = logging.getLogger(__name__)

SLOT_PREFIX = "warm-"  # a slot's name: its records, its root and its uid's holder
_KEYS = 4  # images with a slot kept; the one used longest ago gives its slot up first
_numbers = itertools.count()
_STUB = ("/proc/self/fd/4", "stub")  # souq-waiter itself, as the sandbox's command (waiter.c)


@dataclass(frozen=True)
class Key:
    """What a slot's sandbox was made for: a machine that differs in none of these fits."""

    image: str  # the image's files on the host
    inode: tuple[int, int]  # theirs (st_dev, st_ino): unpacked again, they are other files
    start: str  # the working directory inside
    inner: tuple[int, int]  # the uid and gid inside
    network: bool
    netns: str = ""  # the network namespace it joins (a machine of the private network's)
    resolv_conf: str = ""  # bound at /etc/resolv.conf with it


@dataclass(frozen=True)
class Slot:
    key: Key
    name: str
    user: MachineUser
    waiter: IdleWaiter  # its ``warm`` pipe takes the machine
    pid: int  # bwrap's: the machine's process once taken


def _line(fd: int) -> str:
    """One line of a waiter's report ("" when it closed the pipe first)."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(fd, 64)
        if not chunk:
            break
        line += chunk
    return line.decode(errors="replace").strip()


def _nul_fields(fields: list[str]) -> bytes:
    return b"".join(os.fsencode(f) + b"\0" for f in fields)


def _send(
    waiter: IdleWaiter, job: bytes, meanwhile: Callable[[], None] | None
) -> tuple[str, str, Exception | None]:
    """Hand a warm waiter its machine's job, run ``meanwhile`` while the stub execs, and return
    the waiter's report ("P pid", "E errno", or nothing) with what ``meanwhile`` raised."""
    assert waiter.warm is not None
    failure = None
    try:
        with contextlib.suppress(OSError):  # a waiter gone: its report (none) says so
            _write_all(waiter.warm, job)
        os.close(waiter.warm)
        if meanwhile is not None:
            try:
                meanwhile()
            except Exception as exc:  # raised once the machine is ended
                failure = exc
        report = _line(waiter.report)
    finally:
        os.close(waiter.report)
    kind, _, value = report.partition(" ")
    return kind, value, failure


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class HostParts(Protocol):
    """What of its host driver (:class:`souq.drivers.host.HostDriver`, which holds the slots)
    a slot is made of: the driver is given, not imported, so that it may import this."""

    root: Path
    exec: ExecDriver
    cgroups: Cgroups
    sandbox: bool
    ids: MachineIds | None

    def rootfs_of(self, machine_id: str) -> Path: ...


class WarmSandboxes:
    """The slots of one host driver."""

    def __init__(self, driver: HostParts) -> None:
        self.driver = driver
        waiter = driver.exec.waiter
        backend = driver.cgroups.backend
        self.enabled = (
            driver.sandbox
            and driver.ids is not None
            and rootfs.can_mount()
            and waiter is not None
            and is_static(waiter)
            and (backend is None or isinstance(backend, V1Backend))
            and os.environ.get("SOUQ_WARM_SANDBOXES", "on") != "off"
        )
        self._slots: dict[Key, Slot] = {}  # insertion order: the key used longest ago first
        self._making: dict[Key, concurrent.futures.Future[Slot]] = {}
        self._ahead: dict[str, Key] = {}  # slots made ahead of a claim: by their machine's id
        self._maker: concurrent.futures.ThreadPoolExecutor | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.taken = 0  # starts that took a slot (for tests and the benchmark)
        self._closed = False

    @property
    def pids(self) -> set[int]:
        """The slots' waiters: the driver's to reap."""
        return {slot.waiter.pid for slot in self._slots.values()}

    def ready(self) -> list[Slot]:
        """The slots ready now."""
        return list(self._slots.values())

    def forget(self) -> None:
        """Drop the slots without ending them: what an agent that is killed leaves (tests)."""
        self._slots.clear()

    def key_of(self, spec: MachineSpec, image: sandbox.Image, inner: tuple[int, int]) -> Key | None:
        """The slot a machine would fit (None: none could: it has volumes, or a root from an
        earlier run)."""
        d = self.driver
        if not self.enabled or spec.mounts or (spec.netns is None) != (spec.resolv_conf is None):
            return None
        if d.rootfs_of(spec.machine_id).exists() or d.ids is None:
            return None
        if d.ids.recorded(d.exec.records_dir(spec.machine_id)) is not None:
            return None
        try:
            st = os.stat(image.root)
        except OSError:
            return None
        inode = (st.st_dev, st.st_ino)
        netns, resolv = spec.netns or "", spec.resolv_conf or ""
        return Key(str(image.root), inode, image.start_dir(), inner, spec.network, netns, resolv)

    # -- the take --------------------------------------------------------------------------------

    def start(
        self,
        key: Key,
        spec: MachineSpec,
        cmd: tuple[str, ...],
        meanwhile: Callable[[], None] | None,
    ) -> Handle | None:
        """Start the machine in the slot made for ``key``; None when there is none ready (or it
        cannot become the machine's: the caller starts it cold)."""
        slot = self._slots.pop(key, None)
        if slot is None:
            return None
        if key.netns:
            self._ahead.pop(spec.machine_id, None)
        if not self._alive(slot) or not self._cgroup(slot, spec):
            log.info("a sandbox made ahead (%s) could not be the machine's", slot.name)
            self._discard_later(slot)
            return None
        spec = self._hand_over(slot, spec)
        d = self.driver
        mid = spec.machine_id
        env = d.exec.env_of(spec, d.exec.machine_dir(mid))
        exit_file, log_file = d.exec.record_paths(mid)
        job = _nul_fields(
            [str(exit_file), str(log_file), str(d.exec.log_max_bytes), "", str(len(cmd)), *cmd,
             str(len(env)), *(f"{k}={v}" for k, v in env.items())]
        )  # fmt: skip
        waiter = slot.waiter
        d.exec.waiters.pids.discard(waiter.pid)
        kind, value, failure = _send(waiter, job, meanwhile)
        if kind != "P" or failure is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(slot.pid, signal.SIGKILL)
            processes.reap(waiter.pid)
            if failure is not None:
                raise failure
            why = os.strerror(int(value)) if kind == "E" and value.isdigit() else "it ended"
            raise SpawnError(f"cannot start {cmd[0]!r} in its sandbox: {why}")
        self.taken += 1
        return d.exec.running(mid, waiter.pid, slot.pid, waiter.start_time)

    def _cgroup(self, slot: Slot, spec: MachineSpec) -> bool:
        """Make the slot's spare cgroup the machine's, limited; False when it cannot be."""
        try:
            entry = self.driver.cgroups.prepare(spec.machine_id, spec.limits, slot.waiter.spare)
        except OSError:
            return False
        return not entry.join and entry.clone_into is None

    def _hand_over(self, slot: Slot, spec: MachineSpec) -> MachineSpec:
        """Give the slot's uid and root to the machine; its spec, of that user."""
        d = self.driver
        mid = spec.machine_id
        assert d.ids is not None
        records = d.exec.records_dir(mid)
        user = d.ids.hand_over(slot.name, mid, d.exec.records_dir(slot.name), records)
        try:
            os.rename(d.rootfs_of(slot.name), d.rootfs_of(mid))
        except OSError as exc:
            self._discard(slot)
            raise SpawnError(f"cannot give the machine its root file system: {exc}") from exc
        d.exec.prepare_records(mid, user)
        return replace(spec, user=user)

    def _alive(self, slot: Slot) -> bool:
        try:
            st = os.stat(slot.key.image)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == slot.key.inode and os.path.exists(f"/proc/{slot.pid}")

    # -- making slots ----------------------------------------------------------------------------

    def keep(
        self,
        key: Key,
        image: sandbox.Image,
        *,
        prepare: Callable[[], None] | None = None,
        ahead: str | None = None,
    ) -> bool:
        """Have a slot for ``key`` made, off the event loop, if there is none nor one being made
        (False: none is). ``ahead``: the id of the machine not yet claimed it is made for (its
        key names its network namespace), which ``prepare`` makes first, in the maker's thread."""
        if key in self._slots or key in self._making or self._closed:
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a driver used outside an event loop makes no slot
            return False
        if self._maker is None:
            self._maker = concurrent.futures.ThreadPoolExecutor(1, "souq-warm")
        making = self._maker.submit(self._make, key, image, prepare)
        self._making[key] = making
        if ahead is not None:
            self._ahead[ahead] = key
        task = loop.create_task(self._made(key, making))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def ahead_state(self, machine_id: str) -> str:
        """The slot made ahead for ``machine_id``: ``ready``, ``making``, or "" (none: given up,
        or its making failed)."""
        key = self._ahead.get(machine_id)
        if key is None:
            return ""
        if key in self._slots:
            return "ready"
        return "making" if key in self._making else ""

    def give_up_ahead(self, machine_id: str, fits: Key | None = None) -> None:
        """The slot made ahead for ``machine_id`` given up (its claim failed, or it starts
        without it), unless it is the one for ``fits``. One still being made is ended once made."""
        key = self._ahead.get(machine_id)
        if key is None or key == fits:
            return
        del self._ahead[machine_id]
        slot = self._slots.pop(key, None)
        if slot is not None:
            self._discard_later(slot)

    def end_ahead(self) -> list[str]:
        """Every slot made ahead of a claim ended, now (the agent leaves); their machines' ids."""
        ids = list(self._ahead)
        for key in [self._ahead.pop(mid) for mid in ids]:
            making = self._making.get(key)
            if making is not None:  # let it finish: _made ends it, but its namespace is made now
                with contextlib.suppress(Exception):
                    making.result(timeout=10)
            slot = self._slots.pop(key, None)
            if slot is not None:
                self._discard(slot)
        return ids

    async def _made(self, key: Key, making: concurrent.futures.Future[Slot]) -> None:
        try:
            slot = await asyncio.wrap_future(making)
        except Exception as exc:  # a slot is an optimisation: a start without one is cold
            log.warning("cannot make a sandbox ahead for %s: %s", key.image, exc)
            for mid in [m for m, k in self._ahead.items() if k == key]:
                del self._ahead[mid]  # (its state is then "": its maker gives up the rest)
            return
        finally:
            self._making.pop(key, None)
        if self._closed:  # close() ended it
            return
        if key.netns and key not in self._ahead.values():  # given up meanwhile
            self._discard_later(slot)
            return
        self._slots[key] = slot
        while len(kept := [k for k in self._slots if not k.netns]) > _KEYS:
            self._discard_later(self._slots.pop(kept[0]))  # (slots made ahead: bounded by theirs)

    def _make(self, key: Key, image: sandbox.Image, prepare: Callable[[], None] | None) -> Slot:
        """A slot's uid, root and sandbox (in the maker's thread), after ``prepare``."""
        d = self.driver
        assert d.ids is not None
        if prepare is not None:
            prepare()
        name = f"{SLOT_PREFIX}{os.getpid()}-{next(_numbers)}"
        records = d.exec.records_dir(name)
        user = d.ids.take_ahead(name, records)
        waiter: IdleWaiter | None = None
        try:
            root = rootfs.MachineRoot(d.rootfs_of(name), image.root, user.uid).mount(persist=False)
            argv = sandbox.bwrap_argv(
                d.exec.machine_dir(name),
                network=key.network,
                machines_root=d.root,
                image=image,
                overlay=root,
                inner=key.inner,
                die_with_parent=True,
            )
            if key.resolv_conf:  # as a cold start binds it (the last bind: over the root's)
                argv[-1:-1] = ["--ro-bind", key.resolv_conf, "/etc/resolv.conf"]
            waiter = d.exec.waiters.new_warm()
            leave = d.cgroups.procs_of(WAITERS) if waiter.spare else ()
            netns = Path(key.netns) if key.netns else None
            cgroups = CgroupEntry(leave=leave, netns=netns).waiter_fields()
            cmd = [*argv, *_STUB]
            job = _nul_fields(
                ["", "/", "", str(d.exec.log_max_bytes), user.waiter_field(),
                 str(len(cgroups)), *cgroups, str(len(cmd)), *cmd, "1", f"PATH={DEFAULT_PATH}"]
            )  # fmt: skip
            try:
                _write_all(waiter.job, job)
            finally:
                os.close(waiter.job)
            waiter = replace(waiter, job=-1)
            kind, _, value = _line(waiter.report).partition(" ")
            if kind != "W" or not value.isdigit():
                raise SpawnError(f"souq-waiter did not make the sandbox ({kind or 'no report'})")
            return Slot(key, name, user, waiter, int(value))
        except BaseException:
            if waiter is not None:
                d.exec.waiters.discard(waiter)
            self._remove(name)
            raise

    # -- giving slots up -------------------------------------------------------------------------

    def _discard_later(self, slot: Slot) -> None:
        """:meth:`_discard` in the maker's thread: its unmounts each wait out an RCU grace
        period, and the waiter's end is waited for, neither of which the event loop should."""
        if self._maker is None:
            self._discard(slot)
        else:
            self._maker.submit(self._discard, slot)

    def _discard(self, slot: Slot) -> None:
        """End a slot's sandbox (its waiter reads an empty job) and remove its root and uid."""
        self.driver.exec.waiters.discard(slot.waiter)
        self._remove(slot.name)

    def _remove(self, name: str) -> None:
        d = self.driver
        base = d.rootfs_of(name)
        if base.exists():
            rootfs.MachineRoot(base, base, None).remove()
        records = d.exec.records_dir(name)
        if d.ids is not None:
            d.ids.release(name, records)
        shutil.rmtree(records, ignore_errors=True)

    def sweep(self) -> list[str]:
        """Remove what slots of an earlier agent on this directory left (their sandboxes ended
        with it): their roots, records and uids. Returns the slots' names."""
        d = self.driver
        found = set()
        for parent in (d.rootfs_of("x").parent, d.exec.records_dir("x").parent):
            with contextlib.suppress(OSError):
                found |= {p.name for p in parent.iterdir() if p.name.startswith(SLOT_PREFIX)}
        for name in sorted(found):
            self._remove(name)
        return sorted(found)

    def close(self) -> None:
        self._closed = True
        self._ahead.clear()
        for making in list(self._making.values()):  # a slot being made: let it finish, end it
            with contextlib.suppress(Exception):
                self._discard(making.result(timeout=10))
        self._making.clear()
        for slot in self._slots.values():
            self._discard(slot)
        self._slots.clear()
        if self._maker is not None:  # slots given up in it meanwhile are ended by then
            self._maker.shutdown(wait=True)
            self._maker = None
