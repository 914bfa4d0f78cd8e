"""Process primitives of the exec driver: reaping a child, signalling a machine's process group,
a process's start time, the program a command runs as, the descriptor limit machines get, and
whether a pidfd says its process exited. No state: :mod:`souq.drivers.exec` holds that."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import resource
import select
import shutil
import signal
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path

import psutil

from souq.drivers.base import SpawnError
from souq.drivers.users import MachineUser

__all__ = [
    "Child",
    "exited",
    "kill_group",
    "machine_nofile",
    "open_log",
    "pid_of",
    "pidfd_readable",
    "prepare_workdir",
    "reap",
    "resolve_program",
    "same_process",
    "start_time",
]

# A machine's child: souq-waiter's pid (one waiter per running machine) or, without the
# waiter, the machine's own Popen.
Child = subprocess.Popen[bytes] | int


def kill_group(pid: int, sig: int = signal.SIGKILL) -> bool:
    """Signal the machine's process group, or the process alone while it has none yet
    (souq-waiter reports the pid before its child's ``setsid``). False when it is gone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
    return True


def reap(child: Child) -> int:
    """Wait for the child; its ``Popen.returncode``-style status."""
    if isinstance(child, int):
        while True:
            try:
                return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
            except InterruptedError:
                continue
            except ChildProcessError:
                return 0  # reaped already (by the agent's reaper, after a discard timed out)
    return child.wait()


def exited(pid: int) -> bool:
    """Whether the child ``pid`` has exited (it is left to be reaped), or is not ours."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def pid_of(child: Child) -> int:
    return child if isinstance(child, int) else child.pid


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_BOOT_TIME: float = psutil.boot_time()
_START_TIME_TOLERANCE_S = 0.005  # start times have clock-tick (10 ms) resolution


def start_time(pid: int) -> float | None:
    """When the process started, in seconds since the epoch, as ``psutil`` reports it (read
    straight from ``/proc/<pid>/stat``: this is on the path of every spawn)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        ticks = int(data[data.rindex(b")") + 2 :].split()[19])  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return None
    return ticks / _CLOCK_TICKS + _BOOT_TIME


def same_process(pid: int, started: float) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` (a pid can be used
    again) and runs: not a zombie (dead, waiting for a parent to reap it)."""
    now = start_time(pid)
    if now is None or abs(now - started) > _START_TIME_TOLERANCE_S:
        return False
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def prepare_workdir(workdir: Path, records: Path, exit_file: str, user: MachineUser) -> None:
    """A machine's directory (owned by ``user``, who runs it) and the agent's directory of its
    records (root's), without the exit status of its last run (already reported)."""
    try:
        # The agent's alone (0700): machines, all of one user, never see each other's logs.
        records.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        records.mkdir(exist_ok=True, mode=0o700)
        for made in (records.parent, records):
            os.chmod(made, 0o700)
        with contextlib.suppress(FileNotFoundError):
            (records / exit_file).unlink()
        workdir.mkdir(parents=True, exist_ok=True, mode=0o755)
        if user.switch:  # its user's alone: another machine's uid may not look in
            os.chown(workdir, user.uid, user.gid, follow_symlinks=False)
            os.chmod(workdir, 0o700)
    except OSError as exc:
        raise SpawnError(f"cannot prepare {workdir}: {exc.strerror or exc}") from exc


_LOG_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


def _plain(fd: int) -> None:
    """OSError unless ``fd`` is a plain file with no other name: the log is in a directory its
    machine's user may write, and must never lead the agent to another file."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise OSError(errno.EPERM, "the machine's log is not a plain file")


def open_log(path: Path) -> int:
    """The machine's log, for its output (appended to): a descriptor; SpawnError if it fails."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _LOG_FLAGS, 0o644)
        _plain(fd)
    except OSError as exc:
        raise SpawnError(f"cannot open the machine's log: {exc.strerror or exc}") from exc
    return fd


def resolve_program(program: str, env: Mapping[str, str], workdir: Path) -> str:
    """The path ``program`` runs as (looked up in the machine's ``PATH``, or relative to its
    working directory); SpawnError when it is missing or not executable."""
    if "/" in program:
        found = program if os.path.isabs(program) else str(workdir / program)
    else:
        path = env.get("PATH", os.environ.get("PATH", os.defpath))
        found = shutil.which(program, path=path) or ""
    if not found or not os.path.exists(found):
        raise SpawnError(f"cannot run {program!r}: No such file or directory")
    if not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise SpawnError(f"cannot run {program!r}: Permission denied")
    return found


@functools.cache
def machine_nofile() -> int:
    """The soft ``RLIMIT_NOFILE`` machines get: the agent's own as it started. The agent then
    raises its own soft limit to the hard one, since it holds a pidfd per running machine (a
    host's usual soft limit, 1024, would end it near a thousand machines); souq-waiter puts the
    machine's back (see waiter.c)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft


def pidfd_readable(fd: int, timeout_s: float = 0.0) -> bool:
    """Whether ``fd`` (a pidfd: the process exited) is readable, waiting up to ``timeout_s``.
    ``poll``, not ``select``: an agent with a thousand machines has descriptors past 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))
