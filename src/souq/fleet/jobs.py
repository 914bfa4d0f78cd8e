"""Hollow batch-job runs: a hollow worker pulls, claims, renews and reports jobs exactly as an
agent does (the same :class:`~souq.agent.jobs.runner.JobRunner`), but a run starts no process: it
lasts as long as the job's ``sleep`` says (``["sleep", "0.7"]`` or ``"sleep 0.7"``; anything
else ends at once, exit 0). For measuring the queue at scale (``souq fleet --jobs N``)."""

from __future__ import annotations

import asyncio
import shlex
import signal as signals

from souq.agent.jobs.process import RunRecord
from souq.drivers.base import ExitStatus
from souq.model.job import Job

__all__ = ["HollowJobProcesses", "HollowRun"]


def _seconds(command: str | list[str]) -> float:
    words = shlex.split(command) if isinstance(command, str) else list(command)
    if len(words) == 2 and words[0] == "sleep":
        try:
            return max(0.0, float(words[1]))
        except ValueError:
            return 0.0
    return 0.0


class HollowRun:
    """What the runner reads of a run: its exit (a future), a signal, its pid (none: 0)."""

    pid = 0

    def __init__(self, record: RunRecord, seconds: float) -> None:
        self.record = record
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[ExitStatus] = loop.create_future()
        self._timer = loop.call_later(seconds, self._end, ExitStatus(code=0))

    def _end(self, status: ExitStatus) -> None:
        if not self.exited.done():
            self.exited.set_result(status)

    def signal(self, sig: int) -> bool:
        if self.exited.done():
            return False
        self._timer.cancel()
        self._end(ExitStatus(signal=signals.Signals(sig).name))
        return True

    def detach(self) -> None:
        self._timer.cancel()


class _NoRotation:
    async def run(self) -> None:
        await asyncio.Event().wait()  # hollow runs write no output to rotate


class HollowJobProcesses:
    """The runner's process table, hollow."""

    def __init__(self) -> None:
        self.rotator = _NoRotation()
        self._runs: dict[str, HollowRun] = {}

    def owned_pids(self) -> set[int]:
        return set()

    def spawn(self, job: Job, *, worker_id: str) -> HollowRun:
        record = RunRecord(job.name, job.attempts, worker_id)
        run = self._runs[record.id] = HollowRun(record, _seconds(job.spec.command))
        return run

    def output(self, rid: str) -> tuple[bytes, int]:
        return b"", 0

    def remove(self, rid: str) -> None:
        self._runs.pop(rid, None)

    def reclaim(self) -> list[RunRecord]:
        return []
