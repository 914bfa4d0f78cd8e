"""Every change of every job, whoever makes it: a watch of the ``souq-jobs`` bucket.

Jobs change in many places: the ``/sched`` routes of any broker, the brokers' sweeps, agents
that claim and run jobs straight in the bucket. They all write the bucket, so a watch of it
(JetStream's key-value watch: an ordered consumer that delivers each key's new record) sees
every change once and in order, with nothing for the writers to do. Each broker watches; its
event stream (``GET /v1/events``) tells what :func:`souq.jobs.changes.change_of` names.

* The first records the watch delivers are the queue as it is: history, kept as what is known
  of each job (:class:`~souq.jobs.changes.JobMark`) and told nothing, but for the records
  changed since the watch began (a job submitted while the broker was starting).
* After a lost connection (or a failed watch) the watch starts again; its first records are
  then compared with what was known, so a job that changed meanwhile is told once, as it is
  now (the steps in between are lost; its record says the last one in ``why``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from nats.js.kv import KV_DEL, KV_PURGE, KeyValue
from pydantic import ValidationError

from souq.bus.jetstream import BucketWatch
from souq.clock import Clock, SystemClock
from souq.jobs.changes import JobMark, change_of, mark
from souq.model.job import Job, JobChange

__all__ = ["JobListener", "JobWatch"]

log = logging.getLogger(__name__)

JobListener = Callable[[Job, JobChange, JobMark | None], None]

CHECK_S = 2.0  # how often an idle watch checks that its connection was not lost meanwhile
RETRY_S = 1.0  # after a failed watch


class JobWatch:
    """Tells ``listener(job, change, before)`` of each change of a job (``before``: what was
    known of the job, None if nothing). ``open`` binds the bucket; ``reconnects`` counts the
    connection's reconnections (a change of it starts the watch again)."""

    def __init__(
        self,
        open: Callable[[], Awaitable[KeyValue]],
        listener: JobListener,
        reconnects: Callable[[], int],
        *,
        check_s: float = CHECK_S,
        retry_s: float = RETRY_S,
        clock: Clock | None = None,
    ) -> None:
        self._listener = listener
        self._clock = clock or SystemClock()
        self._since_ms = self._clock.now_ms()  # the first watch tells records changed since
        self._known: dict[str, JobMark] = {}
        self._caught_up = False  # the first watch delivered the queue as it was
        self._watch = BucketWatch(
            open,
            self._on_entry,
            name="souq-jobs-watch",
            on_synced=self._synced,
            reconnects=reconnects,
            retry_s=retry_s,
            check_s=check_s,
        )
        self.told = 0  # changes told (for tests and logs)

    def start(self) -> None:
        self._since_ms = self._clock.now_ms()
        self._watch.start()

    async def close(self) -> None:
        await self._watch.close()

    def _synced(self) -> None:
        self._caught_up = True  # the records as they were are all delivered

    def _on_entry(self, entry: KeyValue.Entry) -> None:
        if entry.operation in (KV_DEL, KV_PURGE):
            self._known.pop(entry.key, None)
        elif entry.value:
            self.on_record(entry.key, entry.value, history=not self._caught_up)

    def on_record(self, key: str, value: bytes, *, history: bool = False) -> None:
        """One record of the bucket: remembered, and its change told (of a record the first
        watch found, only if it changed since the watch began)."""
        try:
            job = Job.model_validate_json(value)
        except ValidationError as exc:
            log.warning("job %s: a record this broker cannot read: %s", key, exc)
            return
        before = self._known.get(key)
        self._known[key] = mark(job)
        told = not history or job.updated_ms >= self._since_ms
        change = change_of(before, job) if told else None
        if change is not None:
            self.told += 1
            self._listener(job, change, before)
