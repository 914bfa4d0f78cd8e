"""A batch job's process on this worker: spawned, watched, signalled, and never left behind.

A run of a job (``<name>.<attempt>``) has two directories under ``<data dir>/jobs``, kept apart
as a machine's are (:mod:`souq.drivers.exec`): ``work/<run>/``, its working directory and
``HOME``, owned by the user machines run as (``--machine-user``); and ``runs/<run>/``, the
agent's own (0700): ``output.log``, its stdout and stderr (rotated past 1 MiB by
:class:`~souq.drivers.logfile.LogRotator`, so that the last MiB is always there to keep), and
``run.json``, the run's name, attempt, pid and start time.

The command (a string runs under ``/bin/sh -c``, a list as it is) runs behind a small shell:

* it joins the run's cgroup (the job's ``cpus`` and ``memory_mb`` as limits, as a machine's
  guest; :class:`~souq.drivers.cgroups.Cgroups`), if the worker enforces limits;
* it forks a **watcher** that blocks reading a pipe whose only writer is the agent, then
  ``exec``s the command (switched to the machine user with ``setpriv`` when that user is not
  the agent's), in a session and process group of its own;
* when the agent dies, however it dies (``kill -9`` included), the kernel closes the pipe; the
  watcher reads end of file and kills the whole process group (``kill -KILL 0``): the job and
  whatever it started in its group. The job can therefore not outlive its agent unnoticed and
  go on running while the queue gives it to another worker once its lease ends.
  (``PR_SET_PDEATHSIG`` would reach the job's first process only: the signal is not inherited
  by its children, and a job is often a shell with children.)

When the job's first process exits the agent kills what is left of its group and removes its
cgroup. At start-up an agent kills what a run recorded in ``run.json`` left (a watcher that was
killed itself), checked by pid *and* start time (:meth:`JobProcesses.reclaim`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from souq.drivers import processes
from souq.drivers.base import ExitStatus, Limits, SpawnError
from souq.drivers.cgroups import Cgroups
from souq.drivers.logfile import LOG, LogRotator, output_start, read_output
from souq.drivers.users import MachineUser
from souq.jobs.output import OUTPUT_MAX_BYTES
from souq.limits import LOG_CHECK_INTERVAL_S
from souq.model.job import Job

__all__ = ["JobProcess", "JobProcesses", "Rotator", "Run", "RunRecord", "Runs", "run_id"]

log = logging.getLogger(__name__)

RUNS = "runs"
WORK = "work"
_RECORD = "run.json"
_INHERITED_ENV = ("PATH", "LANG")
# fd 3: the pipe from the agent, for the watcher alone; the command gets /dev/null for stdin.
# The watcher ignores the signals a stop sends the group: it must outlive the job's SIGTERM.
_WATCH = (
    "exec 3<&0 </dev/null; "
    "{ trap '' TERM INT HUP QUIT; read _ <&3; kill -KILL 0; } & "
    'exec 3<&-; exec "$@"'
)
_JOIN_FAILED = 125


def run_id(name: str, attempt: int) -> str:
    return f"{name}.{attempt}"


@dataclass(frozen=True)
class RunRecord:
    """``run.json``: what the data dir keeps of a run, for the next agent."""

    name: str
    attempt: int
    worker: str
    pid: int = 0
    start_time: float = 0.0

    @property
    def id(self) -> str:
        return run_id(self.name, self.attempt)


class JobProcess:
    """One running job: its process group, and a future for its exit."""

    def __init__(
        self,
        record: RunRecord,
        proc: subprocess.Popen[bytes],
        fence: int,
        pidfd: int,
        owner: JobProcesses,
    ) -> None:
        self.record = record
        self.pid = proc.pid
        self._proc = proc
        self._fence = fence  # the pipe's write end: closed, the watcher kills the group
        self._pidfd: int | None = pidfd
        self._owner = owner
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[ExitStatus] = loop.create_future()
        loop.add_reader(pidfd, self._on_exit)

    def signal(self, sig: int) -> bool:
        """Signal the job's process group; False once it has exited."""
        if self.exited.done():
            return False
        return processes.kill_group(self.pid, sig)

    def _on_exit(self) -> None:
        if self._pidfd is None:
            return
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        # The leader is a zombie until reaped, so its pid still names the group: what the job
        # left in it goes too (the watcher among them).
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        status = ExitStatus.from_returncode(self._proc.wait())
        self._close_fence()
        self._owner.ended(self)
        if not self.exited.done():
            self.exited.set_result(status)

    def _close_fence(self) -> None:
        if self._fence >= 0:
            os.close(self._fence)
            self._fence = -1

    def detach(self) -> None:
        """Stop watching (the agent shuts down and the run is left to the watcher)."""
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self._close_fence()


class JobProcesses:
    """The job processes of one agent, under ``root`` (``<data dir>/jobs``)."""

    def __init__(self, root: Path, *, user: MachineUser, cgroups: Cgroups | None = None) -> None:
        self.root = root
        self.user = user
        self.cgroups = cgroups
        self._base_env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
        self._running: dict[int, JobProcess] = {}
        self.rotator = LogRotator(
            root / RUNS, max_bytes=OUTPUT_MAX_BYTES, interval_s=LOG_CHECK_INTERVAL_S
        )
        self._setpriv = shutil.which("setpriv") if user.switch else None

    def owned_pids(self) -> set[int]:
        """The job processes this agent reaps itself (the agent's reaper leaves them be)."""
        return set(self._running)

    def run_dir(self, rid: str) -> Path:
        return self.root / RUNS / rid

    def work_dir(self, rid: str) -> Path:
        return self.root / WORK / rid

    # -- spawning ----------------------------------------------------------------------------

    def spawn(self, job: Job, *, worker_id: str) -> JobProcess:
        """Start a run of ``job`` (its attempt as the queue counted it at its start);
        :class:`SpawnError` when it cannot start."""
        record = RunRecord(job.name, job.attempts, worker_id)
        rid = record.id
        work, runs = self.work_dir(rid), self.run_dir(rid)
        processes.prepare_workdir(work, runs, _RECORD, self.user)
        command = job.spec.command
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        switch = self._switch()
        script = self._join(rid, job) + _WATCH
        env = {
            **self._base_env,
            "HOME": str(work),
            **job.spec.env,
            "SOUQ_JOB_NAME": job.name,
            "SOUQ_JOB_ATTEMPT": str(job.attempts),
            "SOUQ_WORKER_ID": worker_id,
        }
        out = processes.open_log(runs / LOG)
        watch_r, fence = os.pipe()
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", script, "souq-job", *switch, *argv],
                stdin=watch_r,
                stdout=out,
                stderr=out,
                cwd=work,
                env=env,
                start_new_session=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            os.close(fence)
            self._drop_cgroup(rid)
            raise SpawnError(f"cannot run job {job.name}: {exc}") from exc
        finally:
            os.close(out)
            os.close(watch_r)
        started = processes.start_time(proc.pid) or 0.0
        record = RunRecord(job.name, job.attempts, worker_id, proc.pid, started)
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError as exc:  # out of descriptors: do not run it unwatched
            os.close(fence)
            processes.kill_group(proc.pid)
            proc.wait()
            raise SpawnError(f"cannot watch job {job.name}: {exc.strerror or exc}") from exc
        with contextlib.suppress(OSError):
            (runs / _RECORD).write_text(json.dumps(asdict(record)))
        running = JobProcess(record, proc, fence, pidfd, self)
        self._running[proc.pid] = running
        return running

    def _join(self, rid: str, job: Job) -> str:
        """The script's first line: into the run's cgroup (as the agent, before any switch)."""
        if self.cgroups is None or self.cgroups.backend is None:
            return ""
        limits = Limits(memory_mb=job.spec.memory_mb or None, cpus=job.spec.cpus or None)
        try:
            entry = self.cgroups.prepare(_cgroup(rid), limits)
        except OSError as exc:
            raise SpawnError(f"cannot set up job {job.name}'s cgroup: {exc}") from exc
        procs = list(entry.join)
        if entry.clone_into is not None:
            procs.append(entry.clone_into / "cgroup.procs")
        if not procs:
            return ""
        writes = " && ".join(f"echo $$ > {shlex.quote(str(p))}" for p in procs)
        return f"{{ {writes}; }} || exit {_JOIN_FAILED}; "

    def _switch(self) -> list[str]:
        """The prefix that runs the command as the machine user (none: the agent's own)."""
        user = self.user
        if not user.switch:
            return []
        if self._setpriv is None:
            raise SpawnError(
                f"cannot run a job as {user.describe()}: setpriv (util-linux) is not installed"
            )
        groups = ["--groups", ",".join(map(str, user.groups))] if user.groups else []
        return [
            self._setpriv,
            f"--reuid={user.uid}",
            f"--regid={user.gid}",
            *(groups or ["--clear-groups"]),
            "--",
        ]

    def ended(self, proc: JobProcess) -> None:
        self._running.pop(proc.pid, None)
        self._drop_cgroup(proc.record.id)

    def _drop_cgroup(self, rid: str) -> None:
        if self.cgroups is not None and not self.cgroups.remove(_cgroup(rid)):
            # Still busy with dying processes: an agent's start prunes it once it is empty.
            log.debug("cgroup of job run %s not removed yet", rid)

    # -- after a run -------------------------------------------------------------------------

    def output(self, rid: str) -> tuple[bytes, int]:
        """The run's output: its last :data:`OUTPUT_MAX_BYTES` and how many bytes came before."""
        runs = self.run_dir(rid)
        total = read_output(runs, 0, 0)[1]
        at = max(output_start(runs), total - OUTPUT_MAX_BYTES)
        dropped, chunks = at, []
        while at < total:
            data, _ = read_output(runs, at, total - at)
            if not data:
                break
            chunks.append(data)
            at += len(data)
        return b"".join(chunks), dropped

    def remove(self, rid: str) -> None:
        shutil.rmtree(self.work_dir(rid), ignore_errors=True)
        shutil.rmtree(self.run_dir(rid), ignore_errors=True)

    # -- after an agent restart --------------------------------------------------------------

    def reclaim(self) -> list[RunRecord]:
        """The runs an earlier agent on this data dir left: whatever of them still runs is
        killed (its process group, checked by pid and start time, and its cgroup). Their
        output is still there to keep; :meth:`remove` each when done."""
        left: list[RunRecord] = []
        try:
            dirs = sorted((self.root / RUNS).iterdir())
        except FileNotFoundError:
            return left
        for runs in dirs:
            try:
                raw = json.loads((runs / _RECORD).read_text())
                record = RunRecord(**raw)
            except (OSError, ValueError, TypeError):  # died before it spawned: nothing runs
                name, _, attempt = runs.name.rpartition(".")
                record = RunRecord(name, int(attempt) if attempt.isdigit() else 0, "")
            if record.pid and processes.same_process(record.pid, record.start_time):
                log.warning("job %s: killing run %d, left by an earlier agent", *_run(record))
                processes.kill_group(record.pid)
            self._drop_cgroup(record.id)
            left.append(record)
        return left


def _cgroup(rid: str) -> str:
    return f"job-{rid}"


def _run(record: RunRecord) -> tuple[str, int]:
    return record.name, record.attempt


class Run(Protocol):
    """What the runner reads of a run (a :class:`JobProcess`, or the hollow fleet's)."""

    pid: int
    exited: asyncio.Future[ExitStatus]

    def signal(self, sig: int) -> bool: ...

    def detach(self) -> None: ...


class Rotator(Protocol):
    async def run(self) -> None: ...


class Runs(Protocol):
    """The runner's table of runs (:class:`JobProcesses`, or the hollow fleet's)."""

    @property
    def rotator(self) -> Rotator: ...

    def owned_pids(self) -> set[int]: ...

    def spawn(self, job: Job, *, worker_id: str) -> Run: ...

    def output(self, rid: str) -> tuple[bytes, int]: ...

    def remove(self, rid: str) -> None: ...

    def reclaim(self) -> list[RunRecord]: ...
