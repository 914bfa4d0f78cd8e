"""The broker's stream of cluster events: a bounded ring of machine, worker and batch job events,
each with a per-broker sequence number, that ``GET /v1/events`` reads (and follows) from any
point still held.

Sequence numbers are this broker's: they start at 1 when the broker starts and only grow; another
broker numbers the same events differently. A reader resuming after an id whose successors are no
longer held (the ring moved on, or the id came from another broker or an earlier run of this one)
is told so by :meth:`EventLog.missed` (the stream's ``gap`` event), so it can re-list instead of
trusting a stream with a hole in it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Literal

from pydantic import Field

from souq.model import MachineEvent, MachineState, Record, WorkerState
from souq.model.job import Job, JobChange, JobState

__all__ = ["ClusterEvent", "EventLog", "Gap", "JobNote"]


class JobNote(Record):
    """Job events: which job, what changed and why (docs/jobs.md, "Events")."""

    name: str
    type: JobChange
    why: str = Field(description="the change in words, as the job's record says it")
    attempts: int = Field(description="runs started so far")
    exit_code: int | None = None


class ClusterEvent(Record):
    """One event of the stream: a machine's state change (``kind: machine``), a worker going
    up or down (``kind: worker``) or a batch job's change (``kind: job``)."""

    seq: int = Field(description="per-broker, strictly increasing; the SSE `id:`")
    kind: Literal["machine", "worker", "job"]
    timestamp: int = Field(description="milliseconds since the epoch")
    worker_id: str = Field(description="job events: the worker that holds or held it, or ''")
    region: str = Field(description="'' for job events")
    machine_id: str | None = None
    app: str | None = None
    state: MachineState | WorkerState | JobState = Field(
        description="the machine's, the worker's or the job's state"
    )
    previous: WorkerState | JobState | None = Field(
        default=None, description="worker and job events: the state before"
    )
    event: MachineEvent | None = Field(default=None, description="machine events: the event")
    job: JobNote | None = Field(default=None, description="job events: the job and its change")


class Gap(Record):
    """Events a resuming reader cannot get: it should re-list what it follows."""

    kind: Literal["gap"] = "gap"
    after: int = Field(description="the id the reader resumed after")
    resume_from: int = Field(description="the first id the stream goes on from")
    message: str


class EventLog:
    """A ring of the last ``capacity`` events, and a way to wait for the next one."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._ring: deque[ClusterEvent] = deque(maxlen=capacity)
        self._seq = 0
        self._changed = asyncio.Event()

    @property
    def last_seq(self) -> int:
        return self._seq

    def append_machine(
        self, *, machine_id: str, app: str, worker_id: str, region: str, event: MachineEvent
    ) -> ClusterEvent:
        return self._append(
            kind="machine",
            timestamp=event.timestamp,
            worker_id=worker_id,
            region=region,
            machine_id=machine_id,
            app=app,
            state=event.status,
            event=event,
        )

    def append_worker(
        self,
        *,
        worker_id: str,
        region: str,
        state: WorkerState,
        previous: WorkerState | None,
        timestamp: int,
    ) -> ClusterEvent:
        return self._append(
            kind="worker",
            timestamp=timestamp,
            worker_id=worker_id,
            region=region,
            state=state,
            previous=previous,
        )

    def append_job(
        self, job: Job, change: JobChange, *, previous: JobState | None, worker: str | None
    ) -> ClusterEvent:
        """A job's change; ``worker``: who holds it, or held it until this change."""
        note = JobNote(
            name=job.name,
            type=change,
            why=job.why,
            attempts=job.attempts,
            exit_code=job.exit_code,
        )
        return self._append(
            kind="job",
            timestamp=job.updated_ms,
            worker_id=worker or "",
            region="",
            state=job.state,
            previous=previous,
            job=note,
        )

    def _append(self, **fields: object) -> ClusterEvent:
        self._seq += 1
        item = ClusterEvent.model_validate({"seq": self._seq, **fields})
        self._ring.append(item)
        self._changed.set()
        self._changed = asyncio.Event()
        return item

    def missed(self, seq: int) -> Gap | None:
        """The gap a reader resuming after ``seq`` would not see, or None when every event
        after it is still held (``seq`` 0 means "whatever is held": never a gap)."""
        if seq <= 0:
            return None
        if seq > self._seq:
            return Gap(
                after=seq,
                resume_from=self._ring[0].seq if self._ring else self._seq + 1,
                message=(
                    f"event id {seq} is past this broker's last ({self._seq}): it came from "
                    "another broker or an earlier run of this one; re-list, then follow from here"
                ),
            )
        first = self._ring[0].seq if self._ring else self._seq + 1
        if seq + 1 >= first:
            return None
        return Gap(
            after=seq,
            resume_from=first,
            message=(
                f"events {seq + 1} to {first - 1} are no longer held (this broker keeps the "
                f"last {self._ring.maxlen}); re-list, then follow from here"
            ),
        )

    def since(
        self, seq: int, *, app: str | None = None, worker: str | None = None
    ) -> list[ClusterEvent]:
        """Events after ``seq`` still in the ring, oldest first, filtered."""
        if not self._ring or seq >= self._seq:
            return []
        first = self._ring[0].seq
        start = max(0, seq + 1 - first)
        out = []
        for i in range(start, len(self._ring)):
            item = self._ring[i]
            if app is not None and item.app != app:
                continue
            if worker is not None and item.worker_id != worker:
                continue
            out.append(item)
        return out

    async def wait_after(self, seq: int, timeout: float) -> bool:
        """Wait until an event after ``seq`` exists; False if ``timeout`` passes first."""
        if self._seq > seq:
            return True
        try:
            async with asyncio.timeout(timeout):
                while self._seq <= seq:
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True
