"""The agent's batch-job runner: idle workers pull waiting jobs and run them (docs/jobs.md).

**Pulling** (join-idle-queue, late binding). While the worker has a free job slot (``--jobs``)
and is not cordoned, the runner fetches one name from the ready stream through the agents'
one shared durable consumer (:meth:`souq.jobs.store.JobStore.runners`): of the workers that
ask, the first gets it, so a job goes to whichever worker frees up first and no worker is told
about jobs it has no room for. :func:`~souq.agent.jobs.rules.judge` says what to do with the
name: drop it (ack), put it back later (nak with a delay) or take it: the job's cpus and
memory are reserved in the worker's :class:`~souq.agent.capacity.admission.Admission` (machine
placement sees them in use, through heartbeats and usage messages), the job is claimed by
compare-and-set (a claim lost to another claimant is dropped), then the name is acked.

**Running** (:mod:`souq.agent.jobs.process` for the process). ``start`` is recorded first (the
queue counts the attempt), then the process spawns. Three things follow a run until it ends,
each feeding the run's table (:mod:`souq.agent.jobs.rules`): its exit; its lease, renewed every
``lease/3``, the run fenced when a renewal is refused or none gets through before
``lease - lease/4``; and a watch of the job's key, which brings a cancel (or a deadline that
passed) at once, and a job the queue moved on (fenced at once). Its output is kept
(:mod:`souq.jobs.output`) before its end is reported, so a job that ended has its output kept.

**Shutting down** gives the runs back: each is stopped (SIGTERM, SIGKILL after
:data:`~souq.agent.jobs.rules.STOP_GRACE_S`) and returned to the queue. A run that outlived even
that is left to its watcher, which kills it as the agent's pipe closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from souq.agent.capacity.admission import Admission
from souq.agent.jobs.process import Run, RunRecord, Runs, run_id
from souq.agent.jobs.rules import (
    RENEWING,
    STOP_GRACE_S,
    Action,
    LeaseTimes,
    RunEvent,
    RunState,
    Verdict,
    judge,
    later_delay_s,
    transition,
)
from souq.bus import subjects
from souq.bus.jetstream import OnFirstUse
from souq.clock import Clock
from souq.drivers.base import ExitStatus, SpawnError
from souq.errors import IllegalTransition, JobNotFound, SouqError, Unavailable
from souq.jobs.output import JobOutputs, kept
from souq.jobs.store import JobStore
from souq.market.preemption import JOB_VICTIM, Candidate, may_displace
from souq.model.job import Job, JobEvent, JobRunEvent, JobState, JobStopped
from souq.model.resources import Resources

__all__ = ["JobRunner"]

log = logging.getLogger(__name__)

FETCH_S = 5.0  # one pull request waits this long for a name
RETRY_S = 1.0  # after NATS failed us (binding, fetching, a watch)
KEEP_OUTPUT_S = 10.0  # a run's output is kept within this, or left for the next agent
_HELD = (JobState.CLAIMED, JobState.RUNNING)

Publish = Callable[[str, bytes], Awaitable[None]]


@dataclass(eq=False)
class _Run:
    job: Job
    want: Resources
    renewed_at: float  # monotonic: the start of the last claim, start or renewal that landed
    state: RunState = RunState.RUNNING
    process: Run | None = None
    events: asyncio.Queue[RunEvent] = field(default_factory=asyncio.Queue)
    kill: asyncio.TimerHandle | None = None
    fenced: bool = False  # its lease was lost, or could not be renewed
    after: Job | None = None  # the job as its stop left it
    preempted_by: str | None = None  # the machine that took its room (its room given back)

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def id(self) -> str:
        return run_id(self.job.name, self.job.attempts)


class JobRunner:
    """Pulls and runs batch jobs for one worker; ``start(nc)``, then ``await aclose()``."""

    def __init__(
        self,
        *,
        worker_id: str,
        region: str,
        slots: int,
        lease_s: float,
        processes: Runs,
        admission: Admission,
        clock: Clock,
        announce: Callable[[], None],
        publish: Publish,
    ) -> None:
        self.worker_id = worker_id
        self._region = region
        self._slots = slots
        self._times = LeaseTimes(lease_s)
        self._lease_ms = int(lease_s * 1000)
        self._processes = processes
        self._admission = admission
        self._clock = clock
        self._announce = announce
        self._publish = publish
        self._runs: dict[str, _Run] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._room = asyncio.Event()
        self._main: asyncio.Task[None] | None = None
        self._rotating: asyncio.Task[None] | None = None
        self._outputs: OnFirstUse[JobOutputs] | None = None
        self._sub: JetStreamContext.PullSubscription | None = None
        self._jitter = random.Random(worker_id)  # spreads the delays of names put back
        # What an earlier agent on this data dir left: killed now, kept and given back later.
        self._left = processes.reclaim()

    def owned_pids(self) -> set[int]:
        return self._processes.owned_pids()

    def start(self, nc: Client) -> None:
        self._outputs = OnFirstUse(lambda: JobOutputs.bind(nc))
        loop = asyncio.get_running_loop()
        self._rotating = loop.create_task(self._processes.rotator.run(), name="souq-job-logs")
        self._main = loop.create_task(self._pull(nc), name="souq-job-runner")

    async def aclose(self) -> None:
        """Stop pulling; stop each run and give it back to the queue."""
        for task in (self._main, self._rotating):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self._unsubscribe()  # a name it holds unacked goes to another after the ack wait
        for run in self._runs.values():
            run.events.put_nowait(RunEvent.SHUTDOWN)
        tasks = list(self._tasks.values())
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=STOP_GRACE_S + KEEP_OUTPUT_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- pulling -----------------------------------------------------------------------------

    async def _pull(self, nc: Client) -> None:
        store, sub = await self._bind(nc)
        await self._give_back_left(store)
        log.info(
            "pulling batch jobs: %d at a time, leases of %g s", self._slots, self._lease_ms / 1000
        )
        while True:
            while len(self._runs) >= self._slots or self._admission.cordoned:
                self._room.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RETRY_S):
                        await self._room.wait()
            try:
                msgs = await sub.fetch(1, timeout=FETCH_S)
            except TimeoutError:  # nats-py's too
                continue  # nothing waits: ask again
            except (nats.errors.Error, nats.js.errors.Error) as exc:
                log.warning("pulling batch jobs failed (%s); trying again", exc)
                await asyncio.sleep(RETRY_S)
                await self._unsubscribe()
                store, sub = await self._bind(nc)
                continue
            for msg in msgs:
                try:
                    await self._offered(store, msg)
                except Exception:  # one bad name (a record this agent cannot read) is not all
                    log.exception("batch job %r: taking it failed", msg.data[:200])
                    deliveries = msg.metadata.num_delivered or 1
                    await _answer(msg.nak(delay=later_delay_s(deliveries, self._jitter.random())))

    async def _bind(self, nc: Client) -> tuple[JobStore, JetStreamContext.PullSubscription]:
        """The queue and the pull subscription, once a broker has made them."""
        said = False
        while True:
            try:
                store = await JobStore.bind(nc, clock=self._clock)
                self._sub = await store.runners()
                return store, self._sub
            except Unavailable as exc:
                if not said:
                    log.info("batch jobs wait for the queue: %s", exc.message)
                    said = True
            await asyncio.sleep(RETRY_S)

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _offered(self, store: JobStore, msg: Msg) -> None:
        name = msg.data.decode(errors="replace")
        try:
            job: Job | None = await store.get(name)
        except JobNotFound:
            job = None
        except Unavailable:
            await _answer(msg.nak(delay=RETRY_S))
            return
        now = self._clock.now_ms()
        want = None if job is None else Resources(cpus=job.spec.cpus, memory_mb=job.spec.memory_mb)
        short = None if want is None else self._admission.shortfall(want, now)
        verdict = judge(
            job,
            now,
            short=None if short is None else short.detail,
            deliveries=msg.metadata.num_delivered or 1,
            jitter=self._jitter.random(),
        )
        if verdict.verdict is Verdict.DROP:
            log.debug("job %s: dropped: %s", name, verdict.why)
            await _answer(msg.ack())
            return
        if verdict.verdict is Verdict.LATER or job is None or want is None:
            log.debug("job %s: later: %s", name, verdict.why)
            await _answer(msg.nak(delay=verdict.delay_s))
            return
        # Reserved before the claim's await: no machine claim takes the room meanwhile.
        self._admission.reserve(want)
        self._announce()
        asked = self._clock.monotonic()
        try:
            job = await store.change(
                name, JobEvent.CLAIM, worker=self.worker_id, lease_ms=self._lease_ms
            )
        except (IllegalTransition, JobNotFound) as exc:
            self._unreserve(want)
            log.debug("job %s: not claimed: %s", name, exc)
            await _answer(msg.ack())
            return
        except Unavailable:
            self._unreserve(want)
            await _answer(msg.nak(delay=RETRY_S))
            return
        await _answer(msg.ack())
        run = _Run(job, want, asked)
        self._runs[name] = run
        self._tasks[name] = asyncio.get_running_loop().create_task(
            self._run(store, run), name=f"souq-job-{name}"
        )

    # -- preemption (souq.agent.machines.evictions) ------------------------------------------------

    def preemptible(self, claimant: str) -> list[Candidate]:
        """The running jobs a machine of class ``claimant`` could displace (``job:NAME``)."""
        return [
            Candidate(
                machine_id=JOB_VICTIM + run.name,
                app=run.job.app,
                priority_class=run.job.spec.priority_class,
                resources=run.want,
                price=run.job.spec.max_price,
                created_at=run.job.started_ms or 0,
            )
            for run in self._runs.values()
            if run.state is RunState.RUNNING
            and run.process is not None
            and run.preempted_by is None
            and may_displace(claimant, run.job.spec.priority_class)
        ]

    def preempt(self, name: str, by: str) -> None:
        """Displace job ``name`` for machine ``by``: its room is given back now; its process is
        stopped (SIGTERM, then SIGKILL) and the job goes back to the queue, as at a shutdown."""
        run = self._runs[name]
        run.preempted_by = by
        self._admission.release(run.want)
        run.events.put_nowait(RunEvent.PREEMPTED)
        log.info("job %s: preempted by machine %s", name, by)

    def _unreserve(self, want: Resources) -> None:
        self._admission.release(want)
        self._announce()

    # -- one run -----------------------------------------------------------------------------

    async def _run(self, store: JobStore, run: _Run) -> None:
        try:
            if await self._start(store, run):
                await self._follow(store, run)
        except Exception:  # its process is killed below; its lease runs out: it runs again
            log.exception("job %s: running it failed", run.name)
        finally:
            proc = run.process
            if proc is not None and not proc.exited.done():  # cancelled: leave nothing running
                proc.signal(signal.SIGKILL)
                proc.detach()
            if run.kill is not None:
                run.kill.cancel()
            self._runs.pop(run.name, None)
            self._tasks.pop(run.name, None)
            if run.preempted_by is None:  # a preempted run gave its room back when displaced
                self._unreserve(run.want)
            self._room.set()

    async def _start(self, store: JobStore, run: _Run) -> bool:
        """Record the start (the attempt counted), then spawn; False when it did not run."""
        got = await self._hold(store, run, JobEvent.START)
        if isinstance(got, RunEvent):
            log.warning("job %s: not started: %s", run.name, got)
            if got is RunEvent.LEASE_ENDING:
                await self._settle(store, run, JobEvent.RETURN)
            return False
        if got.cancel_requested:  # cancelled between its claim and its start: not run
            run.after = await self._settle(
                store, run, JobEvent.STOP, JobStopped(error="cancelled before it started")
            )
            log.info("job %s: cancelled before it started", run.name)
            return False
        try:
            run.process = self._processes.spawn(got, worker_id=self.worker_id)
        except SpawnError as exc:
            log.warning("job %s: attempt %d did not start: %s", run.name, got.attempts, exc)
            run.after = await self._settle(
                store, run, JobEvent.STOP, JobStopped(exit_code=127, error=str(exc)[:4096])
            )
            self._processes.remove(run.id)
            await self._tell(run, "job.stopped", outcome="not_started", exit_code=127)
            return False
        log.info("job %s: attempt %d started (pid %d)", run.name, got.attempts, run.process.pid)
        await self._tell(run, "job.started", pid=run.process.pid)
        return True

    async def _follow(self, store: JobStore, run: _Run) -> None:
        proc = run.process
        assert proc is not None
        proc.exited.add_done_callback(lambda _: run.events.put_nowait(RunEvent.EXITED))
        loop = asyncio.get_running_loop()
        helpers = [
            loop.create_task(self._keep_lease(store, run), name=f"souq-job-lease-{run.name}"),
            loop.create_task(self._watch(store, run), name=f"souq-job-watch-{run.name}"),
        ]
        if run.job.cancel_requested:
            run.events.put_nowait(RunEvent.CANCEL_ASKED)
        try:
            while run.state is not RunState.ENDED:
                event = await run.events.get()
                state, actions = transition(run.state, event)
                if state is not run.state:
                    log.info("job %s: %s on %s: %s", run.name, run.state, event, state)
                run.state = state
                run.fenced = run.fenced or state is RunState.FENCED
                if state not in RENEWING:
                    for task in helpers:
                        task.cancel()
                for action in actions:
                    await self._act(store, run, action)
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)

    async def _act(self, store: JobStore, run: _Run, action: Action) -> None:
        proc = run.process
        assert proc is not None
        if action is Action.TERMINATE:
            self._terminate(run, STOP_GRACE_S)
        elif action is Action.FENCE:
            self._terminate(run, self._times.kill_grace_s)
        elif action is Action.KEEP_OUTPUT:
            await self._keep_output(run.job.name, run.job.attempts, run.id)
        elif action is Action.STOP:
            stopped = _stopped(proc.exited.result())
            run.after = await self._settle(store, run, JobEvent.STOP, stopped)
            after = run.after.state if run.after else "unknown (not reported)"
            log.info("job %s: attempt %d %s: %s", run.name, run.job.attempts, _how(proc), after)
            await self._tell(run, "job.stopped", outcome="exited")
        else:  # RETURN
            run.after = await self._settle(store, run, JobEvent.RETURN)
            outcome = "fenced" if run.fenced else "preempted" if run.preempted_by else "returned"
            log.info("job %s: attempt %d %s: %s", run.name, run.job.attempts, _how(proc), outcome)
            await self._tell(run, "job.stopped", outcome=outcome, preempted_by=run.preempted_by)

    def _terminate(self, run: _Run, grace_s: float) -> None:
        """SIGTERM now and SIGKILL after ``grace_s`` (sooner than a kill already set)."""
        proc = run.process
        assert proc is not None
        loop = asyncio.get_running_loop()
        if run.kill is not None:
            if run.kill.when() <= loop.time() + grace_s:
                return
            run.kill.cancel()
        proc.signal(signal.SIGTERM)
        run.kill = loop.call_later(grace_s, proc.signal, signal.SIGKILL)

    # -- the lease and the watch -------------------------------------------------------------

    async def _hold(self, store: JobStore, run: _Run, event: JobEvent) -> Job | RunEvent:
        """``start`` or ``renew``, tried until it lands, is refused (``lease_lost``) or the
        fence comes (``lease_ending``)."""
        fence_at = run.renewed_at + self._times.fence_after_s
        while True:
            asked = self._clock.monotonic()
            if asked >= fence_at:
                return RunEvent.LEASE_ENDING
            try:
                async with asyncio.timeout(fence_at - asked):
                    job = await store.change(
                        run.name, event, worker=self.worker_id, lease_ms=self._lease_ms
                    )
            except TimeoutError:
                return RunEvent.LEASE_ENDING
            except (IllegalTransition, JobNotFound) as exc:
                log.warning("job %s: %s refused: %s", run.name, event, exc)
                return RunEvent.LEASE_LOST
            except Unavailable as exc:
                log.info("job %s: %s did not get through: %s", run.name, event, exc.message)
                wait = min(self._times.retry_s, fence_at - self._clock.monotonic())
                await asyncio.sleep(max(0.0, wait))
                continue
            run.renewed_at = asked
            run.job = job
            return job

    async def _keep_lease(self, store: JobStore, run: _Run) -> None:
        while run.state in RENEWING:
            due = run.renewed_at + self._times.renew_every_s - self._clock.monotonic()
            await asyncio.sleep(max(0.0, due))
            got = await self._hold(store, run, JobEvent.RENEW)
            if isinstance(got, RunEvent):
                run.events.put_nowait(got)
                return
            if got.cancel_requested:
                run.events.put_nowait(RunEvent.CANCEL_ASKED)

    async def _watch(self, store: JobStore, run: _Run) -> None:
        """A cancel (or a deadline passed) at once; a job the queue moved on: fenced."""
        attempt = run.job.attempts
        while True:
            try:
                async with contextlib.aclosing(store.follow(run.name)) as updates:
                    async for job in updates:
                        if job.state not in _HELD or job.worker != self.worker_id:
                            run.events.put_nowait(RunEvent.LEASE_LOST)
                            return
                        if job.attempts != attempt:
                            run.events.put_nowait(RunEvent.LEASE_LOST)
                            return
                        if job.cancel_requested:
                            run.events.put_nowait(RunEvent.CANCEL_ASKED)
            except Unavailable as exc:
                log.debug("job %s: watch broke: %s", run.name, exc)
            await asyncio.sleep(RETRY_S)

    # -- reporting ---------------------------------------------------------------------------

    async def _settle(
        self, store: JobStore, run: _Run, event: JobEvent, stopped: JobStopped | None = None
    ) -> Job | None:
        """``stop`` or ``return``: tried while the lease lasts; None when refused or never
        through (then the lease runs out and the queue takes the job back)."""
        until = run.renewed_at + self._lease_ms / 1000
        while True:
            try:
                return await store.change(run.name, event, worker=self.worker_id, stopped=stopped)
            except (IllegalTransition, JobNotFound) as exc:
                log.info("job %s: %s refused: %s", run.name, event, exc)
                return None
            except Unavailable as exc:
                if self._clock.monotonic() + self._times.retry_s >= until:
                    log.warning("job %s: %s not reported: %s", run.name, event, exc.message)
                    return None
            await asyncio.sleep(self._times.retry_s)

    async def _keep_output(self, name: str, attempt: int, rid: str) -> None:
        """The run's output into the object store, then its files go; kept for the next agent
        when the store cannot be reached."""
        assert self._outputs is not None
        tail, dropped = self._processes.output(rid)
        try:
            async with asyncio.timeout(KEEP_OUTPUT_S):
                while True:
                    try:
                        await (await self._outputs.get()).put(name, attempt, kept(tail, dropped))
                        break
                    except Unavailable as exc:
                        log.info("job %s: output not kept yet: %s", name, exc.message)
                        await asyncio.sleep(RETRY_S)
        except TimeoutError:
            log.warning("job %s: attempt %d's output left in %s", name, attempt, rid)
            return
        self._processes.remove(rid)

    async def _give_back_left(self, store: JobStore) -> None:
        """Runs an earlier agent on this data dir left: their output kept, each job given back
        at once if the queue still has it as this worker's (rather than after its lease)."""
        left, self._left = self._left, []
        for record in left:
            if not record.name or record.attempt < 1:  # not a run's directory
                self._processes.remove(record.id)
                continue
            await self._keep_output(record.name, record.attempt, record.id)
            if record.worker == self.worker_id:
                with contextlib.suppress(SouqError):
                    job = await store.get(record.name)
                    if job.worker == self.worker_id and job.attempts == record.attempt:
                        await store.change(record.name, JobEvent.RETURN, worker=self.worker_id)
                        log.warning("job %s: given back (its run %s was cut short)", *_of(record))

    async def _tell(self, run: _Run, kind: str, **more: object) -> None:
        status = run.process.exited.result() if run.process and run.process.exited.done() else None
        event = JobRunEvent.model_validate(
            {
                "kind": kind,
                "name": run.name,
                "worker": self.worker_id,
                "region": self._region,
                "attempt": run.job.attempts,
                "at_ms": self._clock.now_ms(),
                "exit_code": None if status is None else status.code,
                "signal": None if status is None else status.signal,
                "state": None if run.after is None else run.after.state,
                **more,
            }
        )
        try:
            await self._publish(
                subjects.job_events(self._region, self.worker_id), event.model_dump_json().encode()
            )
        except Unavailable as exc:
            log.debug("job event not sent: %s", exc)


def _stopped(status: ExitStatus) -> JobStopped:
    """An exit as the queue takes it: a code, or minus the signal's number."""
    if status.code is not None:
        return JobStopped(exit_code=status.code)
    number = _signal_number(status.signal)
    return JobStopped(exit_code=-number, error=status.describe()[:4096])


def _signal_number(name: str | None) -> int:
    try:
        return int(signal.Signals[name or ""])
    except KeyError:
        return 255


def _how(proc: Run) -> str:
    return proc.exited.result().describe()


def _of(record: RunRecord) -> tuple[str, str]:
    return record.name, record.id


async def _answer(reply: Awaitable[None]) -> None:
    """An ack or a nak: if it is lost, the name comes back after the consumer's ack wait."""
    with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
        await reply
