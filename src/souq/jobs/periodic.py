"""Periodic jobs (``souq job submit --cron``, Nomad's ``periodic``): a template kept in
JetStream's ``souq-jobs-periodic`` bucket, one key per periodic job, and a run of it queued in
the job queue at each time its schedule names (:mod:`souq.model.schedule`).

Every broker runs :meth:`PeriodicJobs.run` and none is in charge; they never need to agree on
who queues a run, because a run's job is named by its time (``NAME-YYYYMMDDTHHMMSSZ``) and the
queue creates a key only if it does not exist (:meth:`JobStore.submit`): of brokers queuing the
run for time T, exactly one creates it; the others get ``JobExists`` and only record it. The
template's record (its latest time handled and its recent runs) is then updated by a
compare-and-set on its revision; a broker that loses reads it again and finds T handled. A
broker that dies between queuing the run and recording it leaves T unhandled: the next round
(any broker's) queues the same name, finds it made, and records it. A run is never queued twice
and never lost while one broker runs.

Missed times (no broker ran across them): one catch-up run for the latest, at once; the others
are counted in its reason. ``prohibit_overlap``: a time that comes while the previous run has
not ended queues nothing, and the record says the time was skipped and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue
from pydantic import ValidationError

from souq.bus.jetstream import key_value, live_keys, unavailable
from souq.clock import Clock, SystemClock
from souq.errors import JobExists, JobNotFound, SouqError
from souq.jobs.store import JobStore
from souq.model.job import PeriodicJob, PeriodicRun
from souq.model.schedule import Due, plan

__all__ = ["PERIODIC", "PeriodicJobs", "run_name"]

log = logging.getLogger(__name__)

PERIODIC = "souq-jobs-periodic"
RUNS_KEPT = 20
TICK_S = 1.0  # the longest a round waits: a new periodic job is seen this late
_TRIES = 16
_WHAT = "the periodic jobs"


def run_name(name: str, at_ms: int) -> str:
    """The job of ``name``'s run due at ``at_ms``: ``nightly-20261202T030000Z``."""
    return f"{name}-{datetime.fromtimestamp(at_ms / 1000, UTC):%Y%m%dT%H%M%SZ}"


def handled(record: PeriodicJob, due: Due, job: str | None, why: str, now_ms: int) -> PeriodicJob:
    """``record`` once the time ``due`` was handled (its run ``job``, or None: skipped)."""
    run = PeriodicRun(at_ms=due.at_ms, job=job, why=why, queued_ms=now_ms)
    schedule = record.spec.schedule()
    assert schedule is not None
    return record.model_copy(
        update={
            "last_due_ms": due.at_ms,
            "last_run": job if job is not None else record.last_run,
            "next_ms": schedule.next_after(max(now_ms, due.at_ms)),
            "runs": [run, *record.runs][:RUNS_KEPT],
        }
    )


class PeriodicJobs:
    def __init__(self, kv: KeyValue, store: JobStore, clock: Clock | None = None) -> None:
        self._kv = kv
        self._store = store
        self.clock = clock or store.clock or SystemClock()

    @classmethod
    async def open(cls, nc: Client, store: JobStore, *, clock: Clock | None = None) -> PeriodicJobs:
        try:
            kv = await key_value(nc.jetstream(), PERIODIC, "souq periodic batch jobs")
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        return cls(kv, store, clock)

    async def create(self, record: PeriodicJob) -> PeriodicJob:
        """Keep a new periodic job (``JobExists`` when the name is taken)."""
        schedule = record.spec.schedule()
        assert schedule is not None
        now = self.clock.now_ms()
        record = record.model_copy(
            update={
                "created_ms": now,
                "explained": schedule.explain(),
                "next_ms": schedule.next_after(now),
            }
        )
        try:
            revision = await self._kv.create(record.name, _encode(record))
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise JobExists(
                f"periodic job {record.name} exists",
                hint="give it another name, or delete that one (souq job periodic-delete)",
            ) from exc
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        return record.model_copy(update={"revision": revision})

    async def get(self, name: str) -> PeriodicJob:
        try:
            entry = await self._kv.get(name)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.InvalidKeyError) as exc:
            raise JobNotFound(
                f"no periodic job {name}", hint="`souq job periodic` lists them"
            ) from exc
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        if not entry.value:
            raise JobNotFound(f"no periodic job {name}", hint="`souq job periodic` lists them")
        record = _readable(entry.value, entry.revision)
        if record is None:
            raise JobNotFound(f"no periodic job {name}: its record is unreadable")
        return record

    async def all(self) -> list[PeriodicJob]:
        try:
            keys = await live_keys(self._kv)
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        out = []
        for key in keys:
            try:
                out.append(await self.get(key))
            except JobNotFound:
                continue  # deleted meanwhile
        return sorted(out, key=lambda r: r.name)

    async def delete(self, name: str) -> PeriodicJob:
        """Stop queuing runs of ``name`` (runs already queued stay in the queue)."""
        record = await self.get(name)
        try:
            await self._kv.delete(name)
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        return record

    async def round(self) -> float:
        """Queue every run due now; the seconds until the next due time (at most ``TICK_S``)."""
        now = self.clock.now_ms()
        wake = now + int(TICK_S * 1000)
        for record in await self.all():
            try:
                wake = min(wake, await self._handle(record, now))
            except SouqError as exc:  # NATS away: the next round tries again
                log.info("periodic job %s: %s", record.name, exc)
        return max(0.0, (wake - self.clock.now_ms()) / 1000)

    async def _handle(self, record: PeriodicJob, now: int) -> int:
        schedule = record.spec.schedule()
        assert schedule is not None
        for _ in range(_TRIES):
            anchor = record.last_due_ms if record.last_due_ms is not None else record.created_ms
            due, following = plan(schedule, anchor, now)
            if due is None:
                return following
            job, why = await self._queue(record, due)
            after = handled(record, due, job, why, self.clock.now_ms())
            try:
                await self._kv.update(record.name, _encode(after), last=record.revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                record = await self.get(record.name)  # another broker recorded it: look again
                continue
            except (nats.errors.Error, nats.js.errors.Error) as exc:
                raise unavailable(_WHAT, exc) from exc
            log.info("periodic job %s: %s", record.name, why)
            return following
        raise unavailable(_WHAT, TimeoutError(f"periodic job {record.name} kept changing"))

    async def _queue(self, record: PeriodicJob, due: Due) -> tuple[str | None, str]:
        """Queue the run for ``due`` (or skip it: ``prohibit_overlap`` and the last run is
        live); its job's name (None: skipped) and why."""
        spec = record.spec
        if spec.prohibit_overlap and record.last_run is not None:
            try:
                last = await self._store.get(record.last_run)
            except JobNotFound:
                last = None
            if last is not None and not last.state.ended:
                return None, f"{due.why}: skipped, run {last.name} is still {last.state}"
        name = run_name(record.name, due.at_ms)
        run = spec.model_copy(
            update={"name": name, "cron": None, "time_zone": None, "prohibit_overlap": False}
        )
        # another broker may have queued it: the key's create is the compare-and-set
        with contextlib.suppress(JobExists):
            await self._store.submit(run, why=due.why, periodic=record.name, scheduled_ms=due.at_ms)
        return name, due.why

    async def run(self) -> None:
        """Rounds forever, each at the next due time (within a second of it)."""
        while True:
            try:
                delay = await self.round()
            except SouqError as exc:
                log.debug("periodic jobs: %s", exc)
                delay = TICK_S
            await asyncio.sleep(delay)


def _encode(record: PeriodicJob) -> bytes:
    return record.model_dump_json(exclude={"revision"}).encode()


def _readable(raw: bytes, revision: int | None) -> PeriodicJob | None:
    try:
        record = PeriodicJob.model_validate_json(raw)
    except ValidationError:
        return None
    return record.model_copy(update={"revision": revision or 0})
