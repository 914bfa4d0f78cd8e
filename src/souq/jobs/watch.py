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

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import nats.errors
import nats.js.errors
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue
from pydantic import ValidationError

from souq.clock import Clock, SystemClock
from souq.errors import SouqError
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
        self._open = open
        self._listener = listener
        self._reconnects = reconnects
        self._check_s = check_s
        self._retry_s = retry_s
        self._clock = clock or SystemClock()
        self._since_ms = self._clock.now_ms()  # the first watch tells records changed since
        self._known: dict[str, JobMark] = {}
        self._caught_up = False  # the first watch delivered the queue as it was
        self._task: asyncio.Task[None] | None = None
        self.told = 0  # changes told (for tests and logs)

    def start(self) -> None:
        self._since_ms = self._clock.now_ms()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="souq-jobs-watch")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self._follow()
            except (SouqError, nats.errors.Error, nats.js.errors.Error) as exc:
                log.debug("the job watch stopped, starting again: %s", exc)
            await asyncio.sleep(self._retry_s)

    async def _follow(self) -> None:
        """Watch until the connection is lost (then return, to watch again)."""
        reconnects = self._reconnects()
        kv = await self._open()
        watcher = await kv.watchall()
        history = not self._caught_up  # the first watch's first records
        try:
            while True:
                try:
                    entry = await watcher.updates(timeout=self._check_s)  # type: ignore[no-untyped-call]
                except TimeoutError:
                    if self._reconnects() != reconnects:
                        log.info("NATS reconnected: the job watch starts again")
                        return
                    continue
                if entry is None:  # the records as they were are all delivered
                    self._caught_up, history = True, False
                elif entry.operation in (KV_DEL, KV_PURGE):
                    self._known.pop(entry.key, None)
                elif entry.value:
                    self.on_record(entry.key, entry.value, history=history)
        finally:
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                await watcher.stop()  # type: ignore[no-untyped-call]

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
