"""The exec driver: a machine is a process in its own session (process group).

* ``start``: ``subprocess.Popen`` from the event-loop thread, stdin from /dev/null, stdout and
  stderr appended to ``<root>/<id>/output.log``, working directory ``<root>/<id>``. The process
  sees a minimal inherited environment (``PATH``, ``HOME``, ``LANG``), the config's ``env`` and
  ``SOUQ_MACHINE_ID``, ``SOUQ_APP``, ``SOUQ_REGION``, ``SOUQ_WORKER_ID``. A pid file
  (``<root>/<id>/pid``: pid and start time) lets a restarted agent find a process it started but
  had not yet recorded.
* Exits are watched with a pidfd (``os.pidfd_open``) registered with the event loop: no helper
  thread, no SIGCHLD handler. When it becomes readable the driver kills whatever is left of the
  process group and reaps the child with ``Popen.poll`` (the Popen object is kept alive until
  then, so the standard library never reaps it behind our back).
* With ``souq-waiter`` (:mod:`souq.drivers.waiter`, the default when a C compiler exists) the
  process is the waiter's child, not the agent's: the waiter writes its exit status to
  ``<root>/<id>/exit`` and exits, and the driver watches the *waiter's* pidfd and reads that
  file. The status therefore survives an agent crash: a restarted agent re-adopts the waiter
  (recorded in the pid file) or, if the machine died meanwhile, reads the file. Without the
  waiter a process adopted after an agent restart is not our child and its exit status is
  unknown.
* Signals go to the whole process group (``os.killpg``).

Linux only (pidfd needs Linux 5.3).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import signal
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

import psutil

from souq.drivers.base import ExitStatus, Handle, MachineSpec, SpawnError
from souq.drivers.waiter import parse_exit_file, waiter_path
from souq.errors import Unavailable

__all__ = ["INHERITED_ENV", "ExecDriver"]

INHERITED_ENV = ("PATH", "HOME", "LANG")
_LOG = "output.log"
_PIDFILE = "pid"
_EXIT = "exit"  # written by souq-waiter: "code N" or "signal N"
_START_TIME_TOLERANCE_S = 0.005  # start times have clock-tick (10 ms) resolution


@dataclass
class _Watch:
    """A process being watched: its pidfd (None once it exited) and its exit status to come.
    ``wait`` drops the watch after reading the status, so no exit is ever lost to a race
    between the exit and the first ``wait``."""

    fd: int | None
    exited: asyncio.Future[ExitStatus]
    waiter: bool = False  # fd is the waiter's: the status is in the exit file


def _start_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _readable(fd: int) -> bool:
    ready, _, _ = select.select([fd], [], [], 0)
    return bool(ready)


class ExecDriver:
    name = "exec"

    def __init__(self, root: Path, *, use_waiter: bool = True) -> None:
        if not hasattr(os, "pidfd_open"):
            raise Unavailable(
                "the exec driver needs os.pidfd_open (Linux 5.3 or later)",
                hint="run the agent on Linux",
            )
        self.root = root
        self._base_env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._watches: dict[int, _Watch] = {}
        self.waiter = waiter_path() if use_waiter else None

    def owned_pids(self) -> set[int]:
        """Pids of the children this driver reaps itself (the agent's reaper leaves them be)."""
        return {proc.pid for proc in self._children.values()}

    def machine_dir(self, machine_id: str) -> Path:
        return self.root / machine_id

    # -- start and watch -----------------------------------------------------------------------

    def start(self, spec: MachineSpec) -> Handle:
        workdir = self.machine_dir(spec.machine_id)
        env = {
            **self._base_env,
            **spec.env,
            "SOUQ_MACHINE_ID": spec.machine_id,
            "SOUQ_APP": spec.app,
            "SOUQ_REGION": spec.region,
            "SOUQ_WORKER_ID": spec.worker_id,
        }
        try:
            workdir.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                (workdir / _EXIT).unlink()  # the status of the last run, already reported
            out = os.open(
                workdir / _LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644
            )
        except OSError as exc:
            raise SpawnError(f"cannot prepare {workdir}: {exc.strerror or exc}") from exc
        try:
            if self.waiter is None:
                proc = self._popen(list(spec.cmd), env, out, workdir)
                pid = proc.pid
            else:
                proc, pid = self._spawn_waited(self.waiter, spec.cmd, env, out, workdir)
        finally:
            os.close(out)
        self._children[pid] = proc
        handle = Handle(spec.machine_id, pid, _start_time(pid) or 0.0)
        try:
            fd = os.pidfd_open(proc.pid)  # the waiter's, or the process's own
        except OSError as exc:  # e.g. out of file descriptors: do not run it unwatched
            os.killpg(pid, signal.SIGKILL)
            proc.wait()
            del self._children[pid]
            raise SpawnError(f"cannot watch the process: {exc.strerror or exc}") from exc
        self._watch(handle, fd, waiter=self.waiter is not None)
        line = f"{handle.pid} {handle.start_time!r}"
        if self.waiter is not None:
            line += f" {proc.pid} {_start_time(proc.pid) or 0.0!r}"
        with contextlib.suppress(OSError):
            (workdir / _PIDFILE).write_text(line + "\n")
        return handle

    @staticmethod
    def _popen(
        argv: list[str],
        env: dict[str, str],
        out: int,
        workdir: Path,
        pass_fds: tuple[int, ...] = (),
    ) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd=workdir,
                start_new_session=True,
                pass_fds=pass_fds,
            )
        except OSError as exc:
            raise SpawnError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from exc

    def _spawn_waited(
        self,
        waiter: Path,
        cmd: tuple[str, ...],
        env: dict[str, str],
        out: int,
        workdir: Path,
    ) -> tuple[subprocess.Popen[bytes], int]:
        """Start ``cmd`` under souq-waiter; return the waiter and the machine's pid, once the
        waiter reports that the command was exec'd (one line on a pipe, about 1 ms)."""
        r, w = os.pipe()
        try:
            argv = [str(waiter), str(w), str(workdir / _EXIT), *cmd]
            proc = self._popen(argv, env, out, workdir, pass_fds=(w,))
        except SpawnError:
            os.close(r)
            raise
        finally:
            os.close(w)
        report = b""
        try:
            while not report.endswith(b"\n"):
                chunk = os.read(r, 64)
                if not chunk:
                    break
                report += chunk
        finally:
            os.close(r)
        kind, _, value = report.decode(errors="replace").strip().partition(" ")
        if kind == "P" and value.isdigit():
            return proc, int(value)
        proc.wait()
        if kind == "E" and value.isdigit():
            raise SpawnError(f"cannot run {cmd[0]!r}: {os.strerror(int(value))}")
        raise SpawnError(f"souq-waiter failed to start {cmd[0]!r} (exit {proc.returncode})")

    def _watch(self, handle: Handle, fd: int, *, waiter: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self._watches[handle.pid] = _Watch(fd, loop.create_future(), waiter)
        loop.add_reader(fd, self._on_exit, handle)

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
                proc.wait()  # the waiter, which has exited
            status = self.last_exit(handle.machine_id)
            if not status.known:  # the waiter was killed: leave nothing of the machine behind
                with contextlib.suppress(OSError):
                    os.killpg(handle.pid, signal.SIGKILL)
        elif proc is not None:
            # The leader is a zombie until we reap it, so its pid still names our group:
            # anything the machine left behind in it goes too.
            with contextlib.suppress(OSError):
                os.killpg(handle.pid, signal.SIGKILL)
            status = ExitStatus.from_returncode(proc.wait())
        else:
            status = ExitStatus()
        with contextlib.suppress(OSError):
            (self.machine_dir(handle.machine_id) / _PIDFILE).unlink()
        if not watch.exited.done():
            watch.exited.set_result(status)

    async def wait(self, handle: Handle) -> ExitStatus:
        watch = self._watches.get(handle.pid)
        if watch is None:
            return ExitStatus()
        status = await asyncio.shield(watch.exited)
        if self._watches.get(handle.pid) is watch:
            del self._watches[handle.pid]
        return status

    # -- signals -------------------------------------------------------------------------------

    def inspect(self, handle: Handle) -> bool:
        watch = self._watches.get(handle.pid)
        if watch is not None:
            return watch.fd is not None and not _readable(watch.fd)
        return self._same_process(handle)

    def signal(self, handle: Handle, sig: int) -> bool:
        if not self.inspect(handle):
            return False
        try:
            os.killpg(handle.pid, sig)
        except ProcessLookupError:
            return False
        return True

    async def stop(self, handle: Handle, sig: int, timeout_s: float) -> ExitStatus:
        watch = self._watches.get(handle.pid)
        if watch is None:
            return ExitStatus()
        self.signal(handle, sig)
        try:
            return await asyncio.wait_for(asyncio.shield(watch.exited), timeout_s)
        except TimeoutError:
            self.signal(handle, signal.SIGKILL)
            return await asyncio.shield(watch.exited)

    # -- adoption and cleanup ------------------------------------------------------------------

    def _same_process(self, handle: Handle) -> bool:
        started = _start_time(handle.pid)
        if started is None or abs(started - handle.start_time) > _START_TIME_TOLERANCE_S:
            return False
        try:
            return bool(psutil.Process(handle.pid).status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

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
        if _readable(fd) or not self._same_process(handle) or not self._same_process(watched):
            os.close(fd)
            return False
        self._watch(handle, fd, waiter=waiter is not None)
        return True

    def _pidfile(self, machine_id: str) -> list[str]:
        try:
            return (self.machine_dir(machine_id) / _PIDFILE).read_text().split()
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
            text = (self.machine_dir(machine_id) / _EXIT).read_text()
        except OSError:
            return ExitStatus()
        code = parse_exit_file(text)
        return ExitStatus() if code is None else ExitStatus.from_returncode(code)

    def destroy(self, machine_id: str) -> None:
        shutil.rmtree(self.machine_dir(machine_id), ignore_errors=True)

    def read_output(self, machine_id: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        try:
            with open(self.machine_dir(machine_id) / _LOG, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if offset >= size or max_bytes <= 0:
                    return b"", size
                f.seek(offset)
                return f.read(min(max_bytes, size - offset)), size
        except FileNotFoundError:
            return b"", 0

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for watch in self._watches.values():
            if watch.fd is not None:
                loop.remove_reader(watch.fd)
                os.close(watch.fd)
            watch.exited.cancel()
        self._watches.clear()
        # Processes left running are not killed: the next agent re-adopts them. Dropping their
        # Popen objects hands them to the standard library's reaper (subprocess._active); its
        # "still running" ResourceWarning is exactly what we mean here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            self._children.clear()
