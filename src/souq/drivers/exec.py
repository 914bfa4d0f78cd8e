"""The exec driver: a machine is a process in its own session (process group).

* ``start``: stdin from /dev/null, stdout and stderr into the machine's output log (through
  souq-waiter, which bounds it as it writes; appended to directly without the waiter),
  working directory ``<root>/<id>`` (or the spec's ``cwd``: its image's files). The process
  runs as the driver's machine user (:mod:`souq.drivers.users`), who owns ``<root>/<id>``
  and nothing else of the agent's. It sees a minimal inherited environment (``PATH``,
  ``LANG``), ``HOME`` set to its own directory, the config's ``env`` and ``SOUQ_MACHINE_ID``,
  ``SOUQ_APP``, ``SOUQ_REGION``, ``SOUQ_WORKER_ID``, every signal at its default and no
  descriptor of the agent's. The agent's own files of a machine live apart, in the
  root-owned ``<root>/.agent/<id>/``, where the machine cannot touch them (the agent, as
  root, never opens a path its machine could have replaced with a link): the output log
  (``output.log``, bounded there by :mod:`souq.drivers.logfile`), a pid file (pid and start
  time, which lets a restarted agent find a process it started but had not yet recorded)
  and the exit file souq-waiter writes.
* With ``souq-waiter`` (:mod:`souq.drivers.waiter`, the default when a C compiler exists) the
  process is the waiter's child, not the agent's. Two waiters are kept ready (started with
  ``os.posix_spawn`` from a thread of the driver's own, see :meth:`ExecDriver._fill`); a start
  hands one its job. The waiter writes the process's exit status to ``<root>/<id>/exit`` and
  exits, and the driver watches the *waiter's* pidfd and reads that file. The status therefore
  survives an agent crash: a restarted agent re-adopts the waiter (recorded in the pid file)
  or, if the machine died meanwhile, reads the file. Without the waiter the process is the
  agent's own ``subprocess.Popen`` child, and one adopted after an agent restart is not our
  child: its exit status is unknown.
* Exits are watched with a pidfd (``os.pidfd_open``) registered with the event loop: no task
  per machine, no SIGCHLD handler. When it becomes readable the driver reaps its child (the
  waiter, or the process), kills whatever is left of the process group, and hands the status
  to whoever watches (:meth:`ExecDriver.watch`).
* Signals go to the whole process group (``os.killpg``), or to the process alone in the moment
  before its ``setsid``.

Linux only (pidfd needs Linux 5.3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from souq.drivers import logfile, processes, sandbox
from souq.drivers.base import ExitStatus, Handle, MachineSpec, SpawnError
from souq.drivers.cgroups import CgroupEntry, Cgroups, placement_shell
from souq.drivers.processes import machine_nofile, resolve_program
from souq.drivers.programs import resolve_as
from souq.drivers.users import MachineUser, agent_user
from souq.drivers.waiter import parse_exit_file, waiter_path
from souq.drivers.waiter_pool import IdleWaiter, WaiterPool
from souq.errors import Unavailable
from souq.limits import LOG_MAX_BYTES

__all__ = ["INHERITED_ENV", "RECORDS", "ExecDriver", "resolve_program"]

log = logging.getLogger(__name__)

INHERITED_ENV = ("PATH", "LANG")
_LOG = logfile.LOG  # bounded by souq-waiter, or rotated by the agent (souq.drivers.logfile)
_PIDFILE = "pid"
_EXIT = "exit"  # written by souq-waiter: "code N" or "signal N"
RECORDS = ".agent"  # <root>/.agent/<id>/: the agent's files of each machine


@dataclass(slots=True)
class _Watch:
    """A process being watched: its pidfd (None once it exited) and who wants its exit status.
    An exit nobody watched yet is kept (``status``) for the first :meth:`ExecDriver.watch`, so
    no exit is ever lost to a race between the exit and the watch. One small object per
    running machine: no task, no future."""

    fd: int | None
    waiter: bool = False  # fd is the waiter's: the status is in the exit file
    status: ExitStatus | None = None
    callbacks: list[Callable[[ExitStatus], None]] = field(default_factory=list)


def _attempt(call: Callable[[], None] | None) -> Exception | None:
    """Run ``call`` (if any); what it raised, for the caller to raise once its process is
    dealt with."""
    if call is None:
        return None
    try:
        call()
    except Exception as exc:
        return exc
    return None


def _exit_of(driver: ExecDriver, handle: Handle) -> asyncio.Future[ExitStatus]:
    """A future for the process's exit status, from :meth:`ExecDriver.watch`."""
    exited: asyncio.Future[ExitStatus] = asyncio.get_running_loop().create_future()

    def done(status: ExitStatus) -> None:
        if not exited.done():
            exited.set_result(status)

    driver.watch(handle, done)
    return exited


def _behind_shells(
    spec: MachineSpec, placement: CgroupEntry, user: MachineUser
) -> tuple[MachineSpec, tuple[Path, ...] | None]:
    """Without the waiter: the command behind the cgroup placement shell (or the cgroup the
    agent moves a switched process into), and behind ``nsenter`` for a machine of its own
    network namespace (the waiter joins it itself, ``n:``, before the change of user)."""
    join = None
    if placement.join and user.switch:
        join = placement.join  # the shell could not join as the machine's user
    elif placement.join:
        spec = replace(spec, cmd=(*placement_shell(placement.join), *spec.cmd))
    if placement.netns is not None:
        if user.switch:
            raise SpawnError("a machine of its own network needs souq-waiter to join it")
        spec = replace(spec, cmd=("nsenter", f"--net={placement.netns}", *spec.cmd))
    return spec, join


def _placed(place: Callable[[str | None], CgroupEntry], spare: str | None) -> CgroupEntry:
    try:
        return place(spare)
    except OSError as exc:
        raise SpawnError(f"cannot set up the machine's cgroup: {exc}") from exc


class ExecDriver:
    name = "exec"

    def __init__(
        self,
        root: Path,
        *,
        use_waiter: bool = True,
        spares: Cgroups | None = None,
        user: MachineUser | None = None,
        log_max_bytes: int = LOG_MAX_BYTES,
    ) -> None:
        if not hasattr(os, "pidfd_open"):
            raise Unavailable(
                "the exec driver needs os.pidfd_open (Linux 5.3 or later)",
                hint="run the agent on Linux",
            )
        self.root = root
        self.log_max_bytes = log_max_bytes  # each of output.log and output.log.1, at most
        self.user = user or agent_user()  # the agent decides (souq.drivers.users)
        self.base_env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        self._children: dict[int, processes.Child] = {}  # by machine pid
        self._watches: dict[int, _Watch] = {}
        self.waiter = waiter_path() if use_waiter else None
        self.spares = spares  # places the waiters kept ready in spare cgroups (v1)
        nofile = machine_nofile() if self.waiter is not None else None
        self.waiters = WaiterPool(self.waiter, nofile, spares)  # souq-waiters ready for a job

    def owned_pids(self) -> set[int]:
        """Pids of the children this driver reaps itself (the agent's reaper leaves them be)."""
        return {processes.pid_of(child) for child in self._children.values()} | self.waiters.pids

    def machine_dir(self, machine_id: str) -> Path:
        """The machine's own directory: its working directory, owned by its user."""
        return self.root / machine_id

    def record_paths(self, machine_id: str) -> tuple[Path, Path]:
        """The exit file and the output log souq-waiter writes for the machine."""
        records = self.records_dir(machine_id)
        return records / _EXIT, records / _LOG

    def prepare_records(self, machine_id: str, user: MachineUser) -> None:
        """The machine's directory and its records' before a start (no exit of a last run)."""
        workdir = self.machine_dir(machine_id)
        processes.prepare_workdir(workdir, self.records_dir(machine_id), _EXIT, user)

    def records_dir(self, machine_id: str) -> Path:
        """The agent's files of the machine (pid file, exit file): root-owned, apart."""
        return self.root / RECORDS / machine_id

    # -- start and watch -----------------------------------------------------------------------

    def start(
        self,
        spec: MachineSpec,
        *,
        place: Callable[[str | None], CgroupEntry] | None = None,
        meanwhile: Callable[[], None] | None = None,
    ) -> Handle:
        """Spawn the machine. ``place`` sets its cgroup up (see :mod:`souq.drivers.cgroups`),
        given the spare cgroup of the waiter that will run it, and says how the process gets in
        before it runs: souq-waiter does it; without the waiter the command runs behind the
        cgroup placement shell. OSError from ``place`` fails the spawn. ``meanwhile`` runs
        between handing the job to the waiter and its report (it overlaps the fork), or after
        the spawn without one; if it raises, the process is killed and the error raised."""
        join = None  # without the waiter, a cgroup the agent moves a switched process into
        user = spec.user or self.user
        if place is not None and self.waiter is None:
            spec, join = _behind_shells(spec, _placed(place, None), user)
        workdir = self.machine_dir(spec.machine_id)
        cwd = Path(spec.cwd) if spec.cwd else workdir  # an image's files, or its own directory
        if self.waiter is not None:  # the waiter reports before its child's exec: check first
            resolve_as(spec.cmd[0], spec.env, cwd, user)
        env = self.env_of(spec, workdir)
        processes.prepare_workdir(workdir, self.records_dir(spec.machine_id), _EXIT, user)
        waiter_start = 0.0
        proc: processes.Child
        failure: Exception | None = None
        if self.waiter is None:
            proc = self._spawn_direct(list(spec.cmd), env, workdir, cwd, join, user=user)
            pid = proc.pid
            failure = _attempt(meanwhile)
        else:
            idle = self.waiters.take()
            try:
                placement = CgroupEntry() if place is None else _placed(place, idle.spare)
            except SpawnError:
                self.waiters.discard(idle)
                raise
            proc, waiter_start = idle.pid, idle.start_time
            pid, failure = self._run_job(
                idle, spec.cmd, env, workdir, placement, cwd=cwd, user=user, meanwhile=meanwhile
            )
        if failure is not None:
            processes.kill_group(pid)
            processes.reap(proc)
            raise failure
        return self.running(spec.machine_id, proc, pid, waiter_start)

    def running(
        self, machine_id: str, proc: processes.Child, pid: int, waiter_start: float
    ) -> Handle:
        """The machine's process ``pid`` is spawned (``proc``, its waiter or itself): watch it
        and record it for a later agent."""
        self._children[pid] = proc
        handle = Handle(machine_id, pid, processes.start_time(pid) or 0.0)
        try:
            fd = os.pidfd_open(processes.pid_of(proc))  # the waiter's, or the process's own
        except OSError as exc:  # e.g. out of file descriptors: do not run it unwatched
            processes.kill_group(pid)
            processes.reap(proc)
            del self._children[pid]
            raise SpawnError(f"cannot watch the process: {exc.strerror or exc}") from exc
        self._watch(handle, fd, waiter=self.waiter is not None)
        line = f"{handle.pid} {handle.start_time!r}"
        if self.waiter is not None:
            line += f" {processes.pid_of(proc)} {waiter_start!r}"
        with contextlib.suppress(OSError):
            (self.records_dir(machine_id) / _PIDFILE).write_text(line + "\n")
        return handle

    def env_of(self, spec: MachineSpec, workdir: Path) -> dict[str, str]:
        """Its environment: PATH and LANG of the agent's, HOME its own directory (the
        sandbox's mount of it), then its config's (over the image's) and Souq's own."""
        home = sandbox.WORKDIR if spec.driver == "sandbox" else str(workdir)
        return {
            **self.base_env,
            "HOME": home,
            **spec.env,
            "SOUQ_MACHINE_ID": spec.machine_id,
            "SOUQ_APP": spec.app,
            "SOUQ_REGION": spec.region,
            "SOUQ_WORKER_ID": spec.worker_id,
        }

    def _spawn_direct(
        self,
        argv: list[str],
        env: dict[str, str],
        workdir: Path,
        cwd: Path,
        join: tuple[Path, ...] | None,
        *,
        user: MachineUser,
    ) -> subprocess.Popen[bytes]:
        """Without souq-waiter: the machine is the agent's own child, switched to its user by
        ``Popen`` (``user``, ``group``, ``extra_groups``: after the fork, before the exec). A
        switched process cannot join its cgroup itself (``join``): it starts behind a gate, a
        shell that waits for a line on its stdin; the agent moves it into its cgroup, then
        opens the gate, and the shell execs the command with stdin from /dev/null."""
        out = processes.open_log(self.records_dir(workdir.name) / _LOG)
        switch: dict[str, object] = {}
        if user.switch:
            switch = {"user": user.uid, "group": user.gid, "extra_groups": list(user.groups)}
        gate: tuple[int, int] | None = os.pipe() if join is not None else None
        if gate is not None:
            argv = ["/bin/sh", "-c", 'read _; exec </dev/null; exec "$@"', "souq", *argv]
        try:
            proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
                argv,
                env=env,
                stdin=subprocess.DEVNULL if gate is None else gate[0],
                stdout=out,
                stderr=out,
                cwd=cwd,
                start_new_session=True,
                **switch,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            if gate is not None:
                os.close(gate[1])
            raise SpawnError(f"cannot run {argv[0]!r}: {exc}") from exc
        finally:
            os.close(out)
            if gate is not None:
                os.close(gate[0])
        if gate is not None and join is not None:
            try:
                for procs in join:
                    procs.write_text(f"{proc.pid}\n")
            except OSError as exc:
                os.close(gate[1])
                processes.kill_group(proc.pid)
                processes.reap(proc)
                raise SpawnError(f"cannot place the machine in its cgroup: {exc}") from exc
            with contextlib.suppress(OSError):  # a gate nobody waits at: the process is gone
                os.write(gate[1], b"\n")
            os.close(gate[1])
        return proc

    # -- souq-waiter ---------------------------------------------------------------------------

    def prepare_spawns(self, count: int) -> None:
        """Have ``count`` waiters ready: a batch's spawns then wait for no waiter's start-up
        but the first."""
        self.waiters.prepare(count)

    def _run_job(
        self,
        idle: IdleWaiter,
        cmd: tuple[str, ...],
        env: dict[str, str],
        workdir: Path,
        placement: CgroupEntry,
        *,
        cwd: Path,
        user: MachineUser,
        meanwhile: Callable[[], None] | None = None,
    ) -> tuple[int, Exception | None]:
        """Hand the job to a ready waiter, run ``meanwhile`` while it forks, and return the
        machine's pid once the waiter reports its child ready to exec (see waiter.c for the
        job's format), with what ``meanwhile`` raised."""
        r = idle.report
        self.waiters.pids.discard(idle.pid)
        fields = [
            str(self.records_dir(workdir.name) / _EXIT),
            str(cwd),
            str(self.records_dir(workdir.name) / _LOG),
            str(self.log_max_bytes),
            user.waiter_field(),
            str(len(cgroups := placement.waiter_fields())),
            *cgroups,
            str(len(cmd)),
            *cmd,
            str(len(env)),
            *(f"{k}={v}" for k, v in env.items()),
        ]
        job = memoryview(b"".join(os.fsencode(f) + b"\0" for f in fields))
        report = b""
        try:
            try:
                while job:
                    job = job[os.write(idle.job, job) :]
            except OSError:
                pass  # the waiter died: its report (none) says so below
            finally:
                os.close(idle.job)
            failure = _attempt(meanwhile)
            while not report.endswith(b"\n"):
                chunk = os.read(r, 64)
                if not chunk:
                    break
                report += chunk
        finally:
            os.close(r)
        kind, _, value = report.decode(errors="replace").strip().partition(" ")
        if kind == "P" and value.isdigit():
            return int(value), failure
        code = processes.reap(idle.pid)
        if failure is not None:
            raise failure
        if kind == "E" and value.isdigit():
            raise SpawnError(f"cannot start {cmd[0]!r}: {os.strerror(int(value))}")
        raise SpawnError(f"souq-waiter failed to start {cmd[0]!r} (exit {code})")

    def _watch(self, handle: Handle, fd: int, *, waiter: bool = False) -> None:
        self._watches[handle.pid] = _Watch(fd, waiter)
        asyncio.get_running_loop().add_reader(fd, self._on_exit, handle)

    def _on_exit(self, handle: Handle) -> None:
        watch = self._watches.get(handle.pid)
        if watch is None or watch.fd is None:
            return
        asyncio.get_running_loop().remove_reader(watch.fd)
        os.close(watch.fd)
        watch.fd = None
        proc = self._children.pop(handle.pid, None)
        if watch.waiter:
            if proc is not None:
                processes.reap(proc)  # the waiter, which has exited
            status = self.last_exit(handle.machine_id)
            if not status.known:  # the waiter was killed: leave nothing of the machine behind
                with contextlib.suppress(OSError):
                    os.killpg(handle.pid, signal.SIGKILL)
        elif proc is not None:
            # The leader is a zombie until we reap it, so its pid still names our group:
            # anything the machine left behind in it goes too.
            with contextlib.suppress(OSError):
                os.killpg(handle.pid, signal.SIGKILL)
            status = ExitStatus.from_returncode(processes.reap(proc))
        else:
            status = ExitStatus()
        with contextlib.suppress(OSError):
            (self.records_dir(handle.machine_id) / _PIDFILE).unlink()
        if not watch.callbacks:
            watch.status = status  # for the first watch to come
            return
        del self._watches[handle.pid]
        for callback in watch.callbacks:
            try:
                callback(status)
            except Exception:
                log.exception("handling the exit of machine %s failed", handle.machine_id)

    def watch(self, handle: Handle, on_exit: Callable[[ExitStatus], None]) -> None:
        """Call ``on_exit`` with the process's exit status when it exits (from the event loop;
        at once, soon, if it already has, or with an unknown status if it is not watched)."""
        watch = self._watches.get(handle.pid)
        loop = asyncio.get_running_loop()
        if watch is None:
            loop.call_soon(on_exit, ExitStatus())
        elif watch.status is not None:
            del self._watches[handle.pid]
            loop.call_soon(on_exit, watch.status)
        else:
            watch.callbacks.append(on_exit)

    async def wait(self, handle: Handle) -> ExitStatus:
        return await _exit_of(self, handle)

    # -- signals -------------------------------------------------------------------------------

    def inspect(self, handle: Handle) -> bool:
        watch = self._watches.get(handle.pid)
        if watch is not None:
            return watch.fd is not None and not processes.pidfd_readable(watch.fd)
        return self._same_process(handle)

    def signal(self, handle: Handle, sig: int) -> bool:
        if not self.inspect(handle):
            return False
        return processes.kill_group(handle.pid, sig)

    def freeze(self, handle: Handle, frozen: bool) -> bool:
        """Without a cgroup freezer: SIGSTOP (which no process can catch) and SIGCONT, to the
        machine's process group."""
        return self.signal(handle, signal.SIGSTOP if frozen else signal.SIGCONT)

    async def stop(
        self,
        handle: Handle,
        sig: int,
        timeout_s: float,
        *,
        send: Callable[[Handle, int], bool] | None = None,
    ) -> ExitStatus:
        """``send``: how the signals reach the machine (a sandbox's go to its command's group)."""
        if handle.pid not in self._watches:
            return ExitStatus()
        deliver = send or self.signal
        exited = _exit_of(self, handle)
        deliver(handle, sig)
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(exited)
        except TimeoutError:
            deliver(handle, signal.SIGKILL)
            return await exited

    # -- adoption and cleanup ------------------------------------------------------------------

    def _same_process(self, handle: Handle) -> bool:
        return processes.same_process(handle.pid, handle.start_time)

    def recover(self, handle: Handle) -> bool:
        watch = self._watches.get(handle.pid)
        if watch is not None:
            return watch.fd is not None
        if not self._same_process(handle):
            return False
        waiter = self._recorded_waiter(handle)
        watched = waiter or handle
        try:
            fd = os.pidfd_open(watched.pid)
        except OSError:
            return False
        # Check again through the pidfd: the pid cannot be recycled under an open pidfd.
        if (
            processes.pidfd_readable(fd)
            or not self._same_process(handle)
            or not self._same_process(watched)
        ):
            os.close(fd)
            return False
        self._watch(handle, fd, waiter=waiter is not None)
        return True

    def _pidfile(self, machine_id: str) -> list[str]:
        try:
            return (self.records_dir(machine_id) / _PIDFILE).read_text().split()
        except OSError:
            return []

    def _recorded_waiter(self, handle: Handle) -> Handle | None:
        """The live waiter the pid file names for this very process, if any."""
        words = self._pidfile(handle.machine_id)
        try:
            if len(words) != 4 or int(words[0]) != handle.pid:
                return None
            waiter = Handle(handle.machine_id, int(words[2]), float(words[3]))
        except ValueError:
            return None
        return waiter if self._same_process(waiter) else None

    def find(self, machine_id: str) -> Handle | None:
        try:
            pid, start_time = self._pidfile(machine_id)[:2]
            return Handle(machine_id, int(pid), float(start_time))
        except ValueError:
            return None

    def last_exit(self, machine_id: str) -> ExitStatus:
        """The status souq-waiter recorded for the machine's last process (unknown without
        one): how a process that died while no agent watched it is reported."""
        try:
            text = (self.records_dir(machine_id) / _EXIT).read_text()
        except OSError:
            return ExitStatus()
        code = parse_exit_file(text)
        return ExitStatus() if code is None else ExitStatus.from_returncode(code)

    def destroy(self, machine_id: str) -> None:
        shutil.rmtree(self.machine_dir(machine_id), ignore_errors=True)
        shutil.rmtree(self.records_dir(machine_id), ignore_errors=True)

    def read_output(self, machine_id: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Across the log's rotations (:mod:`souq.drivers.logfile`)."""
        return logfile.read_output(self.records_dir(machine_id), offset, max_bytes)

    def output_start(self, machine_id: str) -> int:
        return logfile.output_start(self.records_dir(machine_id))

    @property
    def bounds_logs(self) -> bool:
        """Whether each machine's log is bounded as it is written (by its souq-waiter); if
        not, the agent rotates the logs (:class:`souq.drivers.logfile.LogRotator`)."""
        return self.waiter is not None

    def close(self) -> None:
        self.waiters.close()
        loop = asyncio.get_running_loop()
        for watch in self._watches.values():
            if watch.fd is not None:
                loop.remove_reader(watch.fd)
                os.close(watch.fd)
        self._watches.clear()
        # Processes left running are not killed: the next agent re-adopts them. Their waiters
        # are no longer ours to reap (the agent's reaper takes them); dropping the Popen objects
        # of direct children hands those to the standard library's reaper (subprocess._active),
        # whose "still running" ResourceWarning is exactly what we mean here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            self._children.clear()
