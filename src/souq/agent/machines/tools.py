"""The worker's side of the verbs that act on a machine in place (:mod:`souq.model.machine_tools`):
``exec`` runs a command in the machine's context, ``ps`` lists its processes, ``metadata`` sets or
deletes one key of its config's metadata, ``machine_cordon`` takes it out of the proxies'
rotation or puts it back. None is an operation of the life cycle: none restarts the machine.

**Exec** runs the command where the machine runs, as its process sees the world: the machine
process's own environment (``PORT``, secrets, the image's env), user and groups (read from
``/proc`` of the machine's process, once it runs its own program: souq-waiter reports its child,
and the machine is ``started``, before the child's exec), in the machine's working directory
(its image's ``WorkingDir``, else its own directory: where its process started, wherever that
process went since, as on Fly.io), inside its cgroup (so it counts against its memory, CPU and
pid limits: the driver's placement shell, :class:`~souq.drivers.base.JoinsCgroups`), in a
session of its own. stdout and stderr are kept up to
:data:`~souq.model.machine_tools.EXEC_OUTPUT_MAX_BYTES` each (the rest is read and dropped).
Past its timeout the command's whole process group is killed and the answer is
:class:`~souq.errors.WaitTimeout` (``408 timeout``). A machine of the ``sandbox`` driver lives
in namespaces of its own: the command joins the machine's cgroup first (as the worker, on the
host), then ``nsenter`` enters the namespaces of the machine's command and takes its ids there
(:mod:`souq.drivers.enter`), so it sees the machine's hostname, ``/proc``, files and network;
its environment is the machine command's, its working directory the one the sandbox started
the command in.

**Ps** lists an exec machine's process and its descendants, by host pid (they are the pids the
machine sees). A sandboxed machine's are every process in its pid namespace (exec'd ones too),
by the pid the machine sees: 1 is bwrap's init, 2 the machine's command.

**Metadata and cordon** change the machine's record in one committed step (an event
``metadata``, ``cordon`` or ``uncordon`` that carries the new record to every view): durable in
the agent's store, the same ``instance_id``, the process untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil

from souq.agent.machines.executor import Executor
from souq.agent.machines.images import image_of
from souq.agent.machines.launch import image_workdir
from souq.agent.machines.listening import listening as sockets_of
from souq.agent.state.records import MachineRow
from souq.clock import Clock
from souq.drivers import enter, sandbox
from souq.drivers.base import Handle, has_machine_dirs, joins_cgroups
from souq.errors import (
    ExecUnavailable,
    IllegalTransition,
    InvalidInput,
    MachineNotStarted,
    WaitTimeout,
)
from souq.limits import check_metadata
from souq.model.choices import EventType
from souq.model.machine import Machine, MachineState
from souq.model.machine_tools import (
    EXEC_OUTPUT_MAX_BYTES,
    ExecCommand,
    ExecReply,
    MachineCordonCommand,
    MachineMemory,
    MetadataCommand,
    ProcessSnapshot,
    ProcessStat,
    bounded,
    exit_code_of,
    process_stat,
)
from souq.model.protocol import MachineRef

__all__ = ["MachineTools"]

S = MachineState
T = TypeVar("T")
_CHUNK = 65536
SETUP_WAIT_S = 10.0  # how long an exec waits for a machine's process to run its program
_FIRST_SETUP_POLL_S = 0.005
_LAST_SETUP_POLL_S = 0.1


class MachineTools:
    def __init__(self, executor: Executor, clock: Clock) -> None:
        self._ex = executor
        self._clock = clock
        self.running: set[int] = set()  # exec's commands, waited for here (not the reaper's)

    def answers(self) -> dict[str, Callable[[Any], Awaitable[Any]]]:
        """The verbs these handlers answer (of the operations :mod:`souq.operations` declares),
        by name: the worker's dispatcher routes each to its handler."""
        return {"exec": self.exec, "ps": self._ps, "memory": self._memory}

    async def _ps(self, ref: MachineRef) -> list[ProcessStat]:
        return await self.ps(ref.app, ref.machine_id)

    async def _memory(self, ref: MachineRef) -> MachineMemory:
        """Its limit, and the resident memory of the processes ``ps`` lists."""
        rows = await self.ps(ref.app, ref.machine_id, what="memory")
        limit = self._ex.row(ref.app, ref.machine_id).config.guest.memory_mb
        rss = sum(r.rss for r in rows) / 2**20
        return MachineMemory(limit_mb=limit, rss_mb=round(rss, 1), processes=len(rows))

    def _running(
        self, app: str, machine_id: str, what: str, *states: S
    ) -> tuple[MachineRow, Handle]:
        row = self._ex.row(app, machine_id)
        handle = self._ex.handle(row.id)
        if row.state not in (states or (S.STARTED,)) or handle is None:
            gone = row.state in (S.DESTROYING, S.DESTROYED)
            raise MachineNotStarted(
                f"machine {row.id} is {row.state}: {what} needs a started machine",
                hint="it is gone: create a new machine"
                if gone
                else f"start it (`souq machine start --app {app} {row.id}`), then {what} again",
                details={"state": str(row.state)},
            )
        return row, handle

    # -- exec ------------------------------------------------------------------------------

    async def exec(self, cmd: ExecCommand) -> ExecReply:
        row, handle = self._running(cmd.app, cmd.machine_id, "exec")
        if row.config.driver == "sandbox":
            env, cwd, prefix = await self._sandbox_context(row, handle)
        else:
            env, cwd, prefix = await self._context(row, handle)
        env = host_safe(env)  # the prefix runs as the worker's root before the command
        try:
            proc = await asyncio.create_subprocess_exec(
                *prefix,
                *cmd.argv,
                stdin=asyncio.subprocess.PIPE if cmd.stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:  # no such program or directory (without a prefix, no shell)
            what = cmd.argv[0] if exc.filename is None else exc.filename
            return ExecReply(exit_code=127, stdout="", stderr=f"{what}: {exc.strerror}\n")
        self.running.add(proc.pid)
        try:
            async with asyncio.timeout(cmd.timeout_s):
                out, err, _ = await asyncio.gather(
                    _drain(proc.stdout), _drain(proc.stderr), _feed(proc, cmd.stdin)
                )
                code = await proc.wait()
        except TimeoutError:
            _kill_group(proc)
            await proc.wait()
            raise WaitTimeout(
                f"the command did not finish within {cmd.timeout_s}s on machine {row.id}; "
                "it was killed",
                hint="raise `timeout` (seconds, at most 300), or run it in the background",
                details={"timeout": cmd.timeout_s},
            ) from None
        finally:
            _kill_group(proc)  # what it left running in its session goes with it
            self.running.discard(proc.pid)
        stdout, cut_out = bounded(out)
        stderr, cut_err = bounded(err)
        return ExecReply(
            exit_code=exit_code_of(code), stdout=stdout, stderr=stderr, truncated=cut_out or cut_err
        )

    def _workdir(self, row: MachineRow) -> str | None:
        """Where an exec's command runs: the machine's own working directory, the one its
        process started in (whichever it has moved to since): its image's working directory
        for a machine of an image, else its own directory; for a sandboxed machine, that path
        as the machine sees it. None when it cannot be told here (its image's files are no
        longer cached, a driver that keeps no directory per machine): the process's own."""
        ref = image_of(row.placement)
        held = None if ref is None or self._ex.images is None else self._ex.images.held(ref)
        if ref is not None and held is None:
            return None
        if held is not None:
            rootfs, record = held
            workdir = image_workdir(rootfs, record.run)
            image = sandbox.Image.of(str(rootfs), workdir)  # where bwrap starts its command
            if row.config.driver != "sandbox" or image is None:
                return workdir
            return image.start_dir()
        if row.config.driver == "sandbox":
            return sandbox.WORKDIR
        driver = self._ex.driver
        return str(driver.machine_dir(row.id)) if has_machine_dirs(driver) else None

    async def _context(
        self, row: MachineRow, handle: Handle
    ) -> tuple[dict[str, str], str, list[str]]:
        """The machine process's environment, the machine's working directory, and the argv
        prefix that puts the command in its cgroup and under its user and groups."""
        proc, env = await _own_program(row, handle.pid)
        try:
            cwd = self._workdir(row) or proc.cwd()
        except (psutil.Error, OSError) as exc:
            raise _not_running(row, str(exc)) from None
        driver = self._ex.driver
        prefix = list(driver.join_prefix(row.id)) if joins_cgroups(driver) else []
        uid, gid, groups = _credentials(handle.pid)
        if (uid, gid) != (os.geteuid(), os.getegid()):
            setpriv = _tool(
                "setpriv", f"exec on machine {row.id} must switch to its user ({uid}:{gid})"
            )
            switch = [f"--reuid={uid}", f"--regid={gid}"]
            switch += [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
            prefix += [setpriv, *switch, "--"]
        return env, cwd, prefix

    async def _sandbox_context(
        self, row: MachineRow, handle: Handle
    ) -> tuple[dict[str, str], str, list[str]]:
        """The environment of the sandboxed machine's command, and the argv prefix that puts a
        command in its cgroup (first, as the worker) and then in its namespaces. A machine
        started a moment ago may still be in bwrap's hands (its command not yet exec'd): that
        is waited for, up to ``SETUP_WAIT_S``, as a user who saw it started expects."""
        nsenter = _tool(
            "nsenter",
            f"exec on machine {row.id} must enter its sandbox's namespaces",
            details={"driver": "sandbox", "missing": "nsenter"},
        )
        setup = _SetupWait()
        while True:
            try:
                entry = enter.entry_of(handle.pid)
                env = psutil.Process(entry.target).environ()
                if env or not await setup.pause():
                    break
                continue  # read in the midst of an exec of the command's (none yet, then)
            except psutil.Error as exc:
                raise _not_running(row, str(exc)) from None
            except enter.CannotEnter as exc:
                if exc.reason == "setting_up" and await setup.pause():
                    continue  # bwrap is making the sandbox: soon there
                if exc.reason in ("gone", "setting_up"):
                    raise _not_running(row, str(exc)) from None
                raise ExecUnavailable(
                    f"exec cannot enter machine {row.id}: {exc}",
                    hint="run its sandbox with `bwrap --disable-userns`"
                    if exc.reason == "wider"
                    else "check how the worker runs the machine's sandbox",
                    details={"driver": "sandbox", "reason": exc.reason},
                ) from None
        driver = self._ex.driver
        prefix = list(driver.join_prefix(row.id)) if joins_cgroups(driver) else []
        wd = self._workdir(row) if enter.sets_wd_inside(nsenter) else None
        return env, "/", [*prefix, *enter.nsenter_argv(entry, nsenter, wd)]

    # -- ps --------------------------------------------------------------------------------

    async def ps(self, app: str, machine_id: str, *, what: str = "ps") -> list[ProcessStat]:
        """The machine's processes by pid: an exec machine's process, then every descendant;
        every process in a sandboxed machine's pid namespace, by the pid it has there.
        ``what``: the command asking, for the refusal of a machine not started."""
        row, handle = self._running(app, machine_id, what, S.STARTED, S.SUSPENDED)
        now = self._clock.now_ms() / 1000
        if row.config.driver == "sandbox":
            try:
                init = enter.machine_init(handle.pid)
            except enter.CannotEnter:  # it exited meanwhile
                return []
            listed = _processes(enter.pid_namespace_members(init) if init is not None else [])
        else:
            try:
                root = psutil.Process(handle.pid)
                await _past_exec(root)
                tree = [root, *sorted(root.children(recursive=True), key=lambda p: p.pid)]
            except psutil.NoSuchProcess:
                return []
            listed = [(p, p.pid) for p in tree]
        rows = []
        for p, pid in listed:
            snapshot = _snapshot(p, pid)
            if snapshot is not None:
                rows.append(process_stat(snapshot, now))
        return rows

    # -- metadata and cordon ---------------------------------------------------------------

    def _live(self, app: str, machine_id: str, what: str) -> MachineRow:
        row = self._ex.row(app, machine_id)
        if row.state in (S.DESTROYING, S.DESTROYED):
            raise IllegalTransition(
                f"machine {row.id} is {row.state}: its {what} cannot change",
                hint="change a live machine",
            )
        return row

    def metadata(self, cmd: MetadataCommand) -> dict[str, str]:
        """Set or delete one key; the machine's whole metadata after it. Deleting a key it does
        not have changes nothing (and is no error)."""
        row = self._live(cmd.app, cmd.machine_id, "metadata")
        metadata = dict(row.config.metadata)
        if cmd.value is None:
            if metadata.pop(cmd.key, None) is None:
                return metadata
            message = f"metadata {cmd.key} deleted"
        else:
            if metadata.get(cmd.key) == cmd.value:
                return metadata
            metadata[cmd.key] = cmd.value
            try:
                check_metadata(metadata)
            except ValueError as exc:
                raise InvalidInput(f"metadata: {exc}", details={"field": "metadata"}) from None
            message = f"metadata {cmd.key} set"
        config = row.config.model_copy(update={"metadata": metadata})
        self._ex.apply(
            row.id, type=EventType.METADATA, source="user", message=message, config=config
        )
        return metadata

    def cordon(self, cmd: MachineCordonCommand) -> Machine:
        """Out of the proxies' rotation (it keeps running), or back in. Kept until uncordoned,
        across restarts of the machine and of the agent."""
        row = self._live(cmd.app, cmd.machine_id, "cordon")
        if row.cordoned != cmd.cordoned:
            self._ex.apply(
                row.id,
                type=EventType.CORDON if cmd.cordoned else EventType.UNCORDON,
                source="user",
                message="out of the proxies' rotation"
                if cmd.cordoned
                else "back in the proxies' rotation",
                cordoned=cmd.cordoned,
            )
        return self._ex.machine(cmd.app, cmd.machine_id)


async def _drain(stream: asyncio.StreamReader | None) -> bytes:
    """Everything the stream gives, keeping the first bytes past the bound (so the cut is
    seen) and dropping the rest."""
    if stream is None:
        return b""
    kept = bytearray()
    while chunk := await stream.read(_CHUNK):
        if len(kept) <= EXEC_OUTPUT_MAX_BYTES:
            kept += chunk[: EXEC_OUTPUT_MAX_BYTES + 1 - len(kept)]
    return bytes(kept)


async def _feed(proc: asyncio.subprocess.Process, stdin: str | None) -> None:
    if proc.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if stdin:
            proc.stdin.write(stdin.encode())
            await proc.stdin.drain()
        proc.stdin.close()
        await proc.stdin.wait_closed()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _credentials(pid: int) -> tuple[int, int, tuple[int, ...]]:
    """The process's real uid and gid, and its supplementary groups (``/proc/PID/status``)."""
    uid, gid = os.geteuid(), os.getegid()
    groups: tuple[int, ...] = ()
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "Uid":
                uid = int(value.split()[0])
            elif key == "Gid":
                gid = int(value.split()[0])
            elif key == "Groups":
                groups = tuple(int(g) for g in value.split())
    return uid, gid, groups


class _SetupWait:
    """The pauses of a wait for a machine a moment old to be ready (``for_s`` in all), each
    longer than the last."""

    def __init__(self, for_s: float = SETUP_WAIT_S) -> None:
        loop = asyncio.get_running_loop()
        self._loop, self._give_up = loop, loop.time() + for_s
        self._pause = _FIRST_SETUP_POLL_S

    async def pause(self) -> bool:
        """Wait a little more; False, without waiting, once the wait is over."""
        if self._loop.time() >= self._give_up:
            return False
        await asyncio.sleep(self._pause)  # nothing tells of an exec: looked at again
        self._pause = min(self._pause * 2, _LAST_SETUP_POLL_S)
        return True


def _waiters_copy(proc: psutil.Process) -> bool:
    """Whether the machine's process is still souq-waiter's fork, its own program not yet
    exec'd (the waiter's environment, user and working directory, ``/``, still)."""
    return str(proc.name()).startswith("souq-waiter")


async def _own_program(row: MachineRow, pid: int) -> tuple[psutil.Process, dict[str, str]]:
    """The machine's process once it runs its own program, and its environment: souq-waiter
    reports its child as soon as it is forked (the machine is ``started`` then), and a user
    who saw it started expects an exec to find it as it runs. Read in the midst of an exec
    (a shell's ``exec``), ``/proc`` gives no environment at all: read again. Waited for up to
    ``SETUP_WAIT_S``."""
    setup = _SetupWait()
    try:
        proc = psutil.Process(pid)
        while _waiters_copy(proc):
            if not await setup.pause():
                raise _not_running(row, f"it has not run its program in {SETUP_WAIT_S:.0f}s")
        while not (env := proc.environ()) and await setup.pause():
            pass
    except psutil.Error as exc:
        raise _not_running(row, str(exc)) from None
    return proc, env


def _not_running(row: MachineRow, why: str) -> MachineNotStarted:
    return MachineNotStarted(
        f"machine {row.id}'s process cannot be read ({why}): is it still running?",
        hint="check the machine's state and try again",
    )


def _tool(name: str, why: str, details: dict[str, str] | None = None) -> str:
    """The path of one of util-linux's programs an exec needs, or :class:`ExecUnavailable`
    saying ``why`` it is needed."""
    path = shutil.which(name)
    if path is None:
        raise ExecUnavailable(
            f"{why}, and this worker has no `{name}`",
            hint="install util-linux on the worker",
            details=details or {},
        )
    return path


async def _past_exec(proc: psutil.Process, timeout_s: float = 1.0) -> None:
    """Until the machine's process has exec'd its program: souq-waiter reports its child as
    soon as it is forked (the machine is ``started`` then), and for a moment the child is
    still a copy of the waiter."""
    setup = _SetupWait(timeout_s)
    while _waiters_copy(proc) and await setup.pause():
        pass


def _processes(members: list[tuple[int, int]]) -> list[tuple[psutil.Process, int]]:
    """(host pid, pid inside) as processes, leaving out those gone since they were listed."""
    out = []
    for host, inside in members:
        with contextlib.suppress(psutil.NoSuchProcess):
            out.append((psutil.Process(host), inside))
    return out


def _snapshot(p: psutil.Process, pid: int) -> ProcessSnapshot | None:
    """What ``ps`` shows of one process, under ``pid`` (the pid its machine sees it by); None
    once it is gone. A figure the worker may not read (another user's ``cwd``) is left empty."""
    try:
        with p.oneshot():
            times = p.cpu_times()
            create_time = p.create_time()
            name = p.name()
            rss = p.memory_info().rss
            cmdline: tuple[str, ...] = tuple(_or(p.cmdline, []))
            cwd = _or(p.cwd, "")
            listening: tuple[tuple[str, str, int], ...] = _or(lambda: sockets_of(p.pid), ())
    except psutil.NoSuchProcess:
        return None
    return ProcessSnapshot(
        pid=pid,
        create_time=create_time,
        cmdline=cmdline,
        name=name,
        cwd=cwd,
        cpu_user_s=times.user,
        cpu_system_s=times.system,
        rss=rss,
        listening=listening,
    )


def _or(read: Callable[[], T], default: T) -> T:
    """``read()``, or ``default`` when the worker may not read it."""
    try:
        return read()
    except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return default


# What glibc drops for a setuid program (its UNSECURE_ENVVARS), and what a shell reads at start:
# an exec's prefix (the cgroup shell, setpriv, nsenter) runs as the worker's root with the
# machine's environment, which the machine itself wrote.
_UNSAFE = frozenset({
    "GCONV_PATH", "GETCONF_DIR", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH", "MALLOC_TRACE",
    "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TMPDIR", "TZDIR",
    "BASH_ENV", "ENV",
})  # fmt: skip


def host_safe(env: dict[str, str]) -> dict[str, str]:
    """The machine's environment without what would make the worker's root run the machine's
    code (``LD_PRELOAD`` and the loader's other variables); the exec'd command goes without
    them too."""
    return {k: v for k, v in env.items() if k not in _UNSAFE and not k.startswith("LD_")}
