"""The job queue, kept where the cluster keeps state safely: JetStream's key-value bucket
``souq-jobs``, one key per job (its name), replicated as its stream is. No broker holds any of
it: a broker that restarts, or another broker, sees the same queue.

Beside it, the stream ``souq-jobs-ready`` (work-queue retention, subject ``souq.jobs.ready``)
holds the name of every job that became claimable: at its submit and whenever it goes back to
the queue (returned, its lease run out, a retry). Souq's agents pull from it through one shared
consumer, so each name goes to one idle worker, the first that asks (join-idle-queue, late
binding), with no worker watching the whole queue; the claim itself is still the
compare-and-set below, so a stale name (a job claimed over HTTP meanwhile) is only dropped.

An agent binds to what a broker made (:meth:`JobStore.bind`: the bucket and the stream, none of
them created), pulls names through :meth:`JobStore.runners` and follows a job it runs with
:meth:`JobStore.follow` (a watch of its one key: a cancel reaches it at once).

Every change is :func:`souq.jobs.core.apply` followed by a compare-and-set on the key's
revision (``update(..., last=revision)``). Two claims of one job, from any two brokers or
workers, read the same revision; one write lands, the other finds a newer revision, reads it
again and is refused by the table (the job is claimed now): exactly one claimant wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from secrets import token_hex

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
from pydantic import ValidationError

from souq.bus import subjects
from souq.bus.jetstream import key_value, live_keys, stream, unavailable
from souq.clock import Clock, SystemClock
from souq.errors import IllegalTransition, JobExists, JobNotFound
from souq.jobs import core
from souq.model.job import (
    DEFAULT_QUEUE,
    Job,
    JobEvent,
    JobState,
    JobStopped,
    JobSubmit,
    Registration,
)

__all__ = ["BUCKET", "READY", "READY_SUBJECT", "RUNNERS", "WORKERS", "JobStore"]

log = logging.getLogger(__name__)

BUCKET = "souq-jobs"
WORKERS = "souq-sched-workers"  # the push model's registered workers and what they have free
READY = "souq-jobs-ready"  # the stream of claimable job names
READY_SUBJECT = subjects.JOBS_READY
# A watch's consumer outlives its watcher by this long: a run's watch and a listing each make
# one, and a stream holds at most a thousand (the server deletes a consumer nobody listens to
# after its inactivity threshold, minutes by default).
WATCH_GONE_S = 2.0
ANNOUNCE_AGAIN_MS = 30_000  # a job waiting this long unclaimed is announced again
RUNNERS = "souq-job-runners"  # the agents' shared pull consumer on it
# A name an agent fetched and neither acked nor gave back (it died) goes to another after this.
RUNNERS_ACK_WAIT_S = 30.0
_TRIES = 32  # compare-and-set rounds before giving up (each lost one means another changed it)
_WHAT = "the job queue"


class JobStore:
    def __init__(
        self,
        kv: KeyValue,
        workers: KeyValue | None,
        clock: Clock | None = None,
        js: JetStreamContext | None = None,
    ) -> None:
        self._kv = kv
        self._workers = workers
        self._js = js
        self.clock = clock or SystemClock()
        self._said_again: dict[str, int] = {}  # job -> when this store announced it again
        self._stopping: set[asyncio.Future[None]] = set()  # watches stopped after a cancel

    @classmethod
    async def open(cls, nc: Client, *, clock: Clock | None = None) -> JobStore:
        js = nc.jetstream()
        try:
            kv = await key_value(js, BUCKET, "souq batch jobs: one record per job")
            workers = await key_value(js, WORKERS, "souq batch workers that registered")
            await stream(
                js,
                StreamConfig(
                    name=READY,
                    description="souq batch jobs that became claimable, by name",
                    subjects=[READY_SUBJECT],
                    retention=RetentionPolicy.WORK_QUEUE,
                    storage=StorageType.FILE,
                ),
            )
            await js.add_consumer(READY, _runners_config())
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        return cls(kv, workers, clock, js)

    @classmethod
    async def bind(cls, nc: Client, *, clock: Clock | None = None) -> JobStore:
        """The queue as an agent uses it: the bucket and the ready stream a broker made (none
        is created here; :class:`~souq.errors.Unavailable` until one has), without the push
        model's registered workers."""
        js = nc.jetstream()
        try:
            kv = await js.key_value(BUCKET)
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        return cls(kv, None, clock, js)

    async def runners(self) -> JetStreamContext.PullSubscription:
        """A pull subscription on the ready stream through the agents' one durable consumer
        (made by a broker's :meth:`open`, and its settings put back there: agents may not make
        or change it): each name goes to one of the agents that fetch, whichever asks first."""
        js = self._require_js()
        try:
            return await js.pull_subscribe_bind(RUNNERS, stream=READY)
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc

    async def follow(self, name: str) -> AsyncGenerator[Job, None]:
        """The job as it is now, then each change of it, for as long as the caller iterates
        (a watch of its key); :class:`~souq.errors.Unavailable` when the watch breaks."""
        opening = asyncio.ensure_future(
            self._kv.watch(name, ignore_deletes=True, inactive_threshold=WATCH_GONE_S)
        )
        try:
            watcher = await asyncio.shield(opening)
        except asyncio.CancelledError:  # the watch is made all the same: stop it once it is
            opening.add_done_callback(self._stop_watch)
            raise
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        try:
            async for entry in watcher:
                if entry is not None and entry.value:
                    job = _readable(entry.key, entry.value, entry.revision)
                    if job is not None:
                        yield job
        finally:
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                await watcher.stop()  # type: ignore[no-untyped-call]

    def _stop_watch(self, opening: asyncio.Future[KeyValue.KeyWatcher]) -> None:
        if opening.cancelled() or opening.exception() is not None:
            return
        stopping = asyncio.ensure_future(opening.result().stop())  # type: ignore[no-untyped-call]
        self._stopping.add(stopping)
        stopping.add_done_callback(self._stopping.discard)

    def _require_js(self) -> JetStreamContext:
        if self._js is None:
            raise unavailable(_WHAT, RuntimeError("opened without JetStream"))
        return self._js

    async def _ready(self, job: Job) -> None:
        """Say that ``job`` can be claimed (its name, on the ready stream). The message id is
        the record's revision: said twice within the stream's duplicate window (two minutes),
        the stream keeps it once."""
        if self._js is not None and job.state is JobState.PENDING:
            try:
                await self._js.publish(
                    READY_SUBJECT,
                    job.name.encode(),
                    stream=READY,
                    headers={"Nats-Msg-Id": f"{job.name}:{job.revision}"},
                )
            except (nats.errors.Error, nats.js.errors.Error) as exc:
                # The record is written: HTTP workers see it, and a sweep says it again.
                log.warning("job %s: not announced: %s", job.name, exc)

    async def submit(
        self,
        spec: JobSubmit,
        *,
        why: str = "submitted",
        periodic: str | None = None,
        scheduled_ms: int | None = None,
    ) -> Job:
        """Queue a job (``JobExists`` when its name is taken: the key is created, never
        overwritten, so of two submits of one name exactly one lands). ``periodic``: the run of
        a periodic job due at ``scheduled_ms``, ``why`` saying so."""
        job = core.new_job(spec, self.clock.now_ms())
        job = job.model_copy(
            update={"why": why, "periodic": periodic, "scheduled_ms": scheduled_ms}
        )
        try:
            revision = await self._kv.create(spec.name, _encode(job))
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise JobExists(
                f"job {spec.name} exists", hint="give the job another name, or cancel that one"
            ) from exc
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        job = job.model_copy(update={"revision": revision})
        await self._ready(job)
        return job

    async def get(self, name: str) -> Job:
        try:
            entry = await self._kv.get(name)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.InvalidKeyError) as exc:
            raise JobNotFound(f"no job {name}", hint="`souq job list` shows the jobs") from exc
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        job = _readable(name, entry.value or b"", entry.revision)
        if job is None:
            raise JobNotFound(
                f"no job {name}: its record in the queue is not a job (skipped)",
                hint="an operator can remove it: `nats kv del souq-jobs NAME`",
            )
        return job

    async def all(self) -> list[Job]:
        """Every job, as the bucket holds them now."""
        return [job async for job in self._snapshot()]

    async def _snapshot(self) -> AsyncIterator[Job]:
        try:
            watcher = await self._kv.watchall(ignore_deletes=True, inactive_threshold=WATCH_GONE_S)
            try:
                first = True
                while True:
                    entry = await watcher.updates(timeout=5)  # type: ignore[no-untyped-call]
                    if entry is None and first:  # "empty" may be a watch ended too soon
                        for key in await live_keys(self._kv):
                            try:
                                got = await self._kv.get(key)
                            except nats.js.errors.KeyNotFoundError:
                                continue  # deleted meanwhile
                            if got.value and (job := _readable(key, got.value, got.revision)):
                                yield job
                        return
                    if entry is None:  # the current values are all delivered
                        return
                    first = False
                    if entry.value and (job := _readable(entry.key, entry.value, entry.revision)):
                        yield job
            finally:
                with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                    await watcher.stop()  # type: ignore[no-untyped-call]
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc

    async def change(
        self,
        name: str,
        event: JobEvent,
        *,
        worker: str | None = None,
        lease_ms: int = core.DEFAULT_LEASE_MS,
        stopped: JobStopped | None = None,
    ) -> Job:
        """Apply ``event`` to the job, atomically; the table's refusal (409) when it does not
        apply to the job as it is now."""
        for _ in range(_TRIES):
            job = await self.get(name)
            now = self.clock.now_ms()
            after = core.apply(job, event, now, worker=worker, lease_ms=lease_ms, stopped=stopped)
            try:
                revision = await self._kv.update(name, _encode(after), last=job.revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue  # changed meanwhile: judge it again as it is now
            except (nats.errors.Error, nats.js.errors.Error) as exc:
                raise unavailable(_WHAT, exc) from exc
            after = after.model_copy(update={"revision": revision})
            if job.state is not JobState.PENDING:
                await self._ready(after)  # back in the queue (a no-op unless pending now)
            return after
        raise unavailable(_WHAT, TimeoutError(f"job {name} kept changing under {event}"))

    async def register(self, reg: Registration) -> Registration:
        """Keep what a push-model worker has free (a name is made when it gives none)."""
        named = reg if reg.name else reg.model_copy(update={"name": f"w-{token_hex(6)}"})
        try:
            await self._registered().put(named.name, named.model_dump_json().encode())
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        return named

    async def registration(self, worker: str) -> Registration | None:
        """What ``worker`` registered (its app among it), or None."""
        try:
            entry = await self._registered().get(worker)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.InvalidKeyError):
            return None
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        try:
            return Registration.model_validate_json(entry.value or b"{}")
        except ValidationError as exc:  # as if it had not registered: it registers again
            log.warning("worker %s: its registration is not one, skipped: %s", worker, exc)
            return None

    async def assign(self, worker: str) -> list[Job]:
        """The jobs ``worker`` holds, after claiming for it the waiting ones of its app that fit
        in what it registered as free beside them (oldest first)."""
        reg = await self.registration(worker)
        if reg is None:
            raise JobNotFound(
                f"no registered worker {worker!r}",
                hint="POST /sched/register first, and name yourself with ?worker=",
            )
        app = reg.app or DEFAULT_QUEUE
        jobs = [j for j in await self.all() if j.app == app]
        held = [j for j in jobs if j.worker == worker and not j.state.ended]
        cpu = reg.cpu - sum(j.spec.cpus for j in held)
        mem = reg.mem - sum(j.spec.memory_mb for j in held)
        now = self.clock.now_ms()
        waiting = sorted(
            (j for j in jobs if j.state is JobState.PENDING and j.not_before_ms <= now),
            key=lambda j: (j.submitted_ms, j.name),
        )
        for job in waiting:
            if job.spec.cpus > cpu or job.spec.memory_mb > mem:
                continue
            with contextlib.suppress(IllegalTransition):  # another took it first
                held.append(await self.change(job.name, JobEvent.CLAIM, worker=worker))
                cpu -= job.spec.cpus
                mem -= job.spec.memory_mb
        return held

    def _registered(self) -> KeyValue:
        if self._workers is None:
            raise unavailable(_WHAT, RuntimeError("bound without the registered workers"))
        return self._workers

    async def sweep(self) -> list[Job]:
        """Expire what is due (leases run out, deadlines passed), and say again the names of
        jobs that have waited :data:`ANNOUNCE_AGAIN_MS` unclaimed (their announcement may have
        been lost with the broker that wrote them); the jobs changed."""
        now = self.clock.now_ms()
        changed = []
        jobs = await self.all()
        for job in jobs:
            if core.due(job, now):
                # Another broker (or the holder, renewing) may have changed it first.
                with contextlib.suppress(IllegalTransition):
                    changed.append(await self.change(job.name, JobEvent.EXPIRE))
            elif job.state is JobState.PENDING:
                said = max(job.updated_ms, self._said_again.get(job.name, 0))
                if now - said >= ANNOUNCE_AGAIN_MS:
                    self._said_again[job.name] = now
                    await self._ready(job)  # the stream drops a duplicate within two minutes
        waiting = {j.name for j in jobs if j.state is JobState.PENDING}
        self._said_again = {k: v for k, v in self._said_again.items() if k in waiting}
        return changed


def _encode(job: Job) -> bytes:
    return job.model_dump_json(exclude={"revision"}).encode()


def _runners_config() -> ConsumerConfig:
    """The agents' one pull consumer of the ready stream, as a broker makes it (and puts it
    back when found changed)."""
    return ConsumerConfig(
        name=RUNNERS,
        durable_name=RUNNERS,
        filter_subject=READY_SUBJECT,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=RUNNERS_ACK_WAIT_S,
        max_ack_pending=-1,  # names put back with a delay (a job that fits nowhere) wait
        description="souq agents pulling batch jobs",
    )


def _readable(key: str, raw: bytes, revision: int | None) -> Job | None:
    """The job a record holds; None, with a warning naming its key, for one that is not a
    job's (any worker's credential may write the bucket: a spoiled record is skipped, never a
    failure of a listing)."""
    try:
        job = Job.model_validate_json(raw)
    except ValidationError as exc:
        log.warning("job %s: its record is not a job, skipped: %s", key, exc.errors()[0]["msg"])
        return None
    if job.name != key:
        log.warning("job %s: its record names another job (%s), skipped", key, job.name)
        return None
    return job.model_copy(update={"revision": revision or 0})
