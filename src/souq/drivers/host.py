"""The driver an agent uses on a real host: ``exec`` or ``sandbox`` per machine, with cgroup
limits on both.

It wraps an :class:`~souq.drivers.exec.ExecDriver`, which does the spawning, watching, reaping
and adoption for both kinds: a sandboxed machine is an exec machine whose command is prefixed
with ``bwrap`` (see :mod:`souq.drivers.sandbox`), and a limited one an exec machine that joins
its cgroup before its exec (souq-waiter places it, see :mod:`souq.drivers.cgroups`; without
the waiter a placement shell does); a sandboxed, limited machine
has both, and ``bwrap`` itself is confined. Exit
statuses pass through :meth:`Cgroups.annotate`, which marks out-of-memory kills. ``destroy``
removes the machine's cgroup.

Because a prefix ``exec``s into the command, a command that cannot be found would only show
as an exit with status 127; ``start`` looks it up first, so that it still fails as a
:class:`SpawnError` (a ``failed`` machine), as with the bare exec driver.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import stat
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from souq.drivers import enter, processes, rootfs, sandbox
from souq.drivers.base import ExitStatus, Handle, MachineSpec, RecordsExits, SpawnError
from souq.drivers.cgroups import (
    DEFAULT_PIDS_MAX,
    CgroupEntry,
    Cgroups,
    Mode,
    detect,
    placement_shell,
    prune,
)
from souq.drivers.exec import ExecDriver
from souq.drivers.identity import BASE, MachineIds
from souq.drivers.programs import DEFAULT_PATH, ProgramNotRunnable, resolve_as, resolve_in_image
from souq.drivers.userns import USERNS
from souq.drivers.users import MachineUser
from souq.drivers.warm import Key, WarmSandboxes
from souq.limits import LOG_MAX_BYTES

__all__ = ["HostDriver"]

log = logging.getLogger(__name__)

_REMOVE_RETRIES = 8
# Signals a sandboxed machine's bwrap group gets too: they end or pause the sandbox's init.
_WHOLE = frozenset({signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT})
ROOTFS = ".rootfs"  # <root>/.rootfs/<id>/: the root file systems of machines of images


class HostDriver:
    name = "exec"

    def __init__(
        self,
        root: Path,
        *,
        cgroups: Mode | Cgroups = "auto",
        pids_max: int | None = DEFAULT_PIDS_MAX,
        sandbox_enabled: bool | None = None,
        user: MachineUser | None = None,
        ids: MachineIds | None = None,
        default: str = "auto",
        log_max_bytes: int = LOG_MAX_BYTES,
    ) -> None:
        self.root = root
        self.cgroups = (
            cgroups if isinstance(cgroups, Cgroups) else Cgroups(detect(cgroups), pids_max=pids_max)
        )
        self.exec = ExecDriver(root, spares=self.cgroups, user=user, log_max_bytes=log_max_bytes)
        self.sandbox = sandbox.available() if sandbox_enabled is None else sandbox_enabled
        self.ids = ids  # a uid of each machine's own (souq.drivers.identity), or None
        self.default = default  # of a machine that names no driver: auto, exec or sandbox
        prune(self.cgroups.backend)
        if self.sandbox and ids is not None and rootfs.can_mount():
            USERNS.warm()  # machines of images mount their root through one (idmapped)
        self.warm = WarmSandboxes(self)  # sandboxes made ahead of machines of images
        if self.warm.enabled:
            self.warm.sweep()
        self._pending_removal: set[asyncio.TimerHandle] = set()

    @property
    def drivers(self) -> list[str]:
        """The driver names this worker offers (its fingerprint's ``drivers``)."""
        return ["exec", "sandbox"] if self.sandbox else ["exec"]

    def default_driver(self) -> tuple[str, str | None]:
        """The driver of a machine whose config names none: ``sandbox`` where this host can
        isolate, else ``exec`` and why."""
        if self.default == "exec":
            return "exec", "this worker runs machines as plain processes unless asked (--driver)"
        if self.sandbox:
            return "sandbox", None
        why = sandbox.unavailable() or "the sandbox driver is turned off on this worker"
        return "exec", f"this worker cannot isolate machines: {why}"

    def check_program(self, program: str, env: Mapping[str, str], driver: str) -> None:
        """:class:`~souq.drivers.programs.ProgramNotRunnable` unless the user a machine runs
        as here can run ``program`` (a host program, before the machine exists: its own uid is
        not taken yet, any machine's has the same rights)."""
        if "/" in program and not os.path.isabs(program):
            return  # relative to its own directory, which does not exist yet
        user = self.user if self.ids is None else MachineUser("a machine's own uid", BASE, BASE)
        path = resolve_as(program, {**self.exec.base_env, **env}, self.root, user)
        if driver != "sandbox":
            return
        for seen in (path, os.path.realpath(path)):  # a sandbox's /tmp and /run are its own
            hidden = sandbox.hidden_under(seen)
            if hidden is not None:
                why = f"it is under {hidden}, which a sandboxed machine sees as its own, empty"
                raise ProgramNotRunnable(program, user.describe(), seen, why)

    @property
    def user(self) -> MachineUser:
        """Who machines run as."""
        return self.exec.user

    def describe_user(self) -> str:
        """Who machines run as, for the fingerprint."""
        if self.ids is None:
            return self.user.describe()
        last = self.ids.base + self.ids.count - 1
        return f"a uid of each machine's own ({self.ids.base}-{last})"

    @property
    def isolation(self) -> dict[str, object]:
        """Limits (cgroups) and namespaces, as the fingerprint says them."""
        driver, why_not = self.default_driver()
        namespaces = "mount,pid,ipc,uts" + (",user" if self.ids is not None else "")
        return {
            **self.cgroups.isolation,
            "default_driver": driver,
            "namespaces": namespaces if self.sandbox else "none",
            **({"why_not": why_not} if why_not else {}),
        }

    # -- start ---------------------------------------------------------------------------------

    def start(self, spec: MachineSpec, *, meanwhile: Callable[[], None] | None = None) -> Handle:
        if spec.driver not in self.drivers:
            raise SpawnError(f"this worker has no {spec.driver!r} driver")
        image = sandbox.Image.of(spec.image_root, spec.cwd) if spec.driver == "sandbox" else None
        whole = image is not None and image.is_root
        if whole:  # its own userland: the image's PATH (Docker's default), root's HOME
            spec = replace(spec, env={"PATH": DEFAULT_PATH, "HOME": "/root", **spec.env})
        warm = self._warm_key(spec, image if whole else None)
        if warm is not None and image is not None:  # a sandbox made ahead, if one is ready
            own = MachineUser("a machine's own uid", BASE, BASE)
            program = self._resolve(spec, Path(image.root), image, own)
            handle = self.warm.start(warm, spec, (program, *spec.cmd[1:]), meanwhile)
            if handle is not None:
                self._started(handle)
                if not warm.netns:  # (one of a namespace of its own is made ahead of its claim)
                    self.warm.keep(warm, image)  # the next machine's
                return handle
        user = self.machine_user(spec.machine_id, take=True)
        spec = replace(spec, user=user)
        workdir = self.exec.machine_dir(spec.machine_id)
        program = self._resolve(spec, Path(spec.cwd) if spec.cwd else workdir, image, user)
        cmd: tuple[str, ...] = (program, *spec.cmd[1:])
        self._own_volumes(spec, user)
        if spec.driver == "sandbox":
            overlay = None
            if image is not None and whole and rootfs.can_mount():
                uid = user.uid if user.switch else None
                machine_root = rootfs.MachineRoot(self.rootfs_of(spec.machine_id), image.root, uid)
                overlay = machine_root.mount(persist=spec.persist_rootfs)
            inner = None
            if user.switch:  # root inside, or the image's User
                inner = (0, 0)
                if image is not None and whole:
                    inner = sandbox.inner_ids(image.root, spec.image_user)
            jail = sandbox.bwrap_argv(
                workdir,
                network=spec.network,
                machines_root=self.root,
                image=image,
                mounts=spec.mounts,
                overlay=overlay,
                inner=inner,
                die_with_parent=self.exec.waiter is not None,
            )
            if spec.resolv_conf is not None:  # its network's DNS (the last bind: over the root's)
                jail[-1:-1] = ["--ro-bind", spec.resolv_conf, "/etc/resolv.conf"]
            cmd = (*jail, *cmd)
            spec = replace(spec, cwd=None)  # bwrap moves into the machine's directory itself
        elif spec.mounts:
            link_volumes(workdir, spec.mounts)
        prepare = functools.partial(self.cgroups.prepare, spec.machine_id, spec.limits)
        netns = Path(spec.netns) if spec.netns is not None else None

        def place(spare: str | None) -> CgroupEntry:
            return replace(prepare(spare), netns=netns)

        handle = self.exec.start(replace(spec, cmd=cmd), place=place, meanwhile=meanwhile)
        self._started(handle)
        if warm is not None and image is not None and not warm.netns:
            self.warm.keep(warm, image)  # the next machine of its image starts warm
        return handle

    # -- sandboxes made ahead of their claim (souq.drivers.warm) --------------------------------

    def keep_ahead(self, spec: MachineSpec, prepare: Callable[[], None]) -> bool:
        """Have a sandbox made for ``spec``'s machine, not yet claimed, in its network
        namespace (``spec.netns``), which ``prepare`` makes first, in the maker's thread; False:
        none can be (nothing was run)."""
        if spec.driver != "sandbox" or spec.netns is None or not self.warm.enabled:
            return False
        image = sandbox.Image.of(spec.image_root, spec.cwd)
        if image is None or not image.is_root:
            return False
        key = self.warm.key_of(spec, image, sandbox.inner_ids(image.root, spec.image_user))
        if key is None:
            return False
        return self.warm.keep(key, image, prepare=prepare, ahead=spec.machine_id)

    def ahead_state(self, machine_id: str) -> str:
        return self.warm.ahead_state(machine_id)

    def give_up_ahead(self, machine_id: str) -> None:
        self.warm.give_up_ahead(machine_id)

    def end_ahead(self) -> list[str]:
        return self.warm.end_ahead()

    def _warm_key(self, spec: MachineSpec, image: sandbox.Image | None) -> Key | None:
        """The slot a machine of an image (its own root) would fit; a slot made ahead for it
        that it does not fit is given up."""
        warm = None
        if image is not None and self.warm.enabled:
            warm = self.warm.key_of(spec, image, sandbox.inner_ids(image.root, spec.image_user))
        if spec.netns is not None:
            self.warm.give_up_ahead(spec.machine_id, fits=warm)
        return warm

    def _started(self, handle: Handle) -> None:
        try:
            self.cgroups.started(handle.machine_id)
        except OSError as exc:  # it must not run without its cpu limit
            self.exec.signal(handle, signal.SIGKILL)
            raise SpawnError(f"cannot set the machine's cpu limit: {exc}") from exc

    def machine_user(self, machine_id: str, *, take: bool = False) -> MachineUser:
        """Who the machine runs as on the host: its own uid when this worker gives each
        machine one (taken, with ``take``, if it has none yet), else the worker's machine
        user."""
        if self.ids is None:
            return self.user
        records = self.exec.records_dir(machine_id)
        if take:
            return self.ids.user(machine_id, records)
        uid = self.ids.recorded(records)
        return self.user if uid is None else MachineUser(f"machine {machine_id}", uid, uid)

    def rootfs_of(self, machine_id: str) -> Path:
        return self.root / ROOTFS / machine_id

    def unmount_roots(self) -> list[str]:
        """Detach every machine's root file system (its machines have all stopped: the agent
        leaves for good, ``stop_machines_on_exit``); a start mounts a machine's root again."""
        return rootfs.unmount_under(self.root / ROOTFS)

    def _own_volumes(self, spec: MachineSpec, user: MachineUser) -> None:
        """The machine's user owns the top of each of its volumes (it writes there)."""
        for host_dir, _ in spec.mounts:
            try:
                if user.switch:
                    os.chown(host_dir, user.uid, user.gid, follow_symlinks=False)
            except OSError as exc:
                raise SpawnError(f"cannot give the volume at {host_dir} to the machine") from exc

    def _resolve(
        self, spec: MachineSpec, cwd: Path, image: sandbox.Image | None, user: MachineUser
    ) -> str:
        """The command's program as its user finds it (:mod:`souq.drivers.programs`), checked
        before a prefix ``exec``s it: inside an image that is its root, in the image."""
        program = spec.cmd[0]
        if image is not None and image.is_root:
            inside = "root" if user.switch or user.is_root else user.describe()
            return resolve_in_image(program, spec.env, image.start_dir(), image.root, inside)
        found = resolve_as(program, spec.env, cwd, user)
        if spec.driver == "sandbox" and "/" in program:
            return program  # relative to where the sandbox starts, or the same path inside
        return found

    # -- everything else is the exec driver's, with exits annotated ----------------------------

    def watch(self, handle: Handle, on_exit: Callable[[ExitStatus], None]) -> None:
        annotate = self.cgroups.annotate
        self.exec.watch(handle, lambda status: on_exit(annotate(handle.machine_id, status)))

    async def wait(self, handle: Handle) -> ExitStatus:
        return self.cgroups.annotate(handle.machine_id, await self.exec.wait(handle))

    async def stop(self, handle: Handle, sig: int, timeout_s: float) -> ExitStatus:
        status = await self.exec.stop(handle, sig, timeout_s, send=self.signal)
        return self.cgroups.annotate(handle.machine_id, status)

    def last_exit(self, machine_id: str) -> ExitStatus:
        inner = self.exec
        status = inner.last_exit(machine_id) if isinstance(inner, RecordsExits) else ExitStatus()
        return self.cgroups.annotate(machine_id, status)

    def machine_dir(self, machine_id: str) -> Path:
        return self.exec.machine_dir(machine_id)

    def join_prefix(self, machine_id: str) -> tuple[str, ...]:
        """The placement shell that moves a command into the machine's cgroup (an exec)."""
        if self.cgroups.backend is None:
            return ()
        return placement_shell(self.cgroups.procs_of(machine_id))

    def owned_pids(self) -> set[int]:
        return self.exec.owned_pids() | self.warm.pids

    def prepare_spawns(self, count: int) -> None:
        self.exec.prepare_spawns(count)

    def signal(self, handle: Handle, sig: int) -> bool:
        """A sandboxed machine's signal goes to its command's own process group (the outer
        ``bwrap`` would die of it, and the rest be killed before the command could act);
        SIGKILL, SIGSTOP and SIGCONT to ``bwrap``'s group too, which holds the sandbox's init."""
        command = enter.machine_command(handle.pid) if self.exec.inspect(handle) else None
        if command is None:
            return self.exec.signal(handle, sig)
        sent = processes.kill_group(command, sig)
        if sig in _WHOLE:
            sent = self.exec.signal(handle, sig) or sent
        return sent

    def freeze(self, handle: Handle, frozen: bool) -> bool:
        """The cgroup freezer where the host has one, else SIGSTOP and SIGCONT."""
        if not self.exec.inspect(handle):
            return False
        if self.cgroups.freeze(handle.machine_id, frozen):
            return True
        return self.signal(handle, signal.SIGSTOP if frozen else signal.SIGCONT)

    def inspect(self, handle: Handle) -> bool:
        return self.exec.inspect(handle)

    def recover(self, handle: Handle) -> bool:
        return self.exec.recover(handle)

    def find(self, machine_id: str) -> Handle | None:
        return self.exec.find(machine_id)

    def read_output(self, machine_id: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        return self.exec.read_output(machine_id, offset, max_bytes)

    def output_start(self, machine_id: str) -> int:
        return self.exec.output_start(machine_id)

    def destroy(self, machine_id: str) -> None:
        base = self.rootfs_of(machine_id)
        if base.exists():
            rootfs.MachineRoot(base, base, None).remove()
        if self.ids is not None:
            self.ids.release(machine_id, self.exec.records_dir(machine_id))
        self.exec.destroy(machine_id)
        if not self.cgroups.remove(machine_id):
            self._remove_later(machine_id, 0)

    def _remove_later(self, machine_id: str, attempt: int) -> None:
        """Its processes were killed but have not all finished dying: try again, backing off."""
        if attempt >= _REMOVE_RETRIES:
            log.warning("the cgroup of machine %s is still busy; leaving it", machine_id)
            return

        def retry() -> None:
            self._pending_removal.discard(timer)
            if not self.cgroups.remove(machine_id):
                self._remove_later(machine_id, attempt + 1)

        timer = asyncio.get_running_loop().call_later(0.005 * 2**attempt, retry)
        self._pending_removal.add(timer)

    def close(self) -> None:
        for timer in self._pending_removal:
            timer.cancel()
        self._pending_removal.clear()
        self.warm.close()
        self.exec.close()


def link_volumes(workdir: Path, mounts: tuple[tuple[str, str], ...]) -> None:
    """A plain process has no mount namespace: each volume is a symbolic link in the machine's
    own directory named as the mount path's last part (``/data``: ``$HOME/data``), made without
    following anything the machine could have put there. An entry of that name that is not a
    link is left alone (the machine's own file wins); the env names the volume either way."""
    workdir.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for host_dir, path in mounts:
            name = path.rstrip("/").rpartition("/")[2]
            try:
                if stat.S_ISLNK(os.lstat(name, dir_fd=fd).st_mode):
                    os.unlink(name, dir_fd=fd)
                else:
                    continue
            except FileNotFoundError:
                pass
            os.symlink(host_dir, name, dir_fd=fd)
    except OSError as exc:
        raise SpawnError(f"cannot link the machine's volume: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
