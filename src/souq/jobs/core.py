"""A job's life as a table: which event may move it from which state, and where to.

Pure: events in, the next record out (or :class:`~souq.errors.IllegalTransition`, a 409 that
names the state and what is allowed). The store (:mod:`souq.jobs.store`) applies a transition
with a compare-and-set on the record's revision, so of two claims of one job exactly one
succeeds, whichever broker or worker makes them.

=============  ==============================  ===================================================
event          from                            to
=============  ==============================  ===================================================
``claim``      pending (backoff over)          claimed, leased to the claimant
``start``      claimed                         running (an attempt counted)
``renew``      claimed, running                the same, lease extended
``stop``       claimed, running                succeeded (exit 0); pending after a backoff
                                               (on-failure, retries left); failed; cancelled
                                               (cancel asked); failed (cancel asked, and its
                                               deadline passed)
``release``    claimed, running                as ``stop`` (the seed's end of a run: ``claim``,
                                               run, ``release``); from claimed, the run is
                                               counted as an attempt first
``return``     claimed, running                pending (the claimant gives it back untouched)
``expire``     claimed, running (lease over)   pending (or cancelled, or failed past its
               pending (deadline over)         deadline); failed
``cancel``     pending                         cancelled
               claimed, running                the same, ``cancel_requested`` (its worker stops it
                                               and says ``stop``; past its lease it is cancelled)
=============  ==============================  ===================================================
"""

from __future__ import annotations

from typing import Any

from souq.errors import IllegalTransition
from souq.model.job import DEFAULT_QUEUE, Job, JobEvent, JobState, JobStopped, JobSubmit

__all__ = ["DEFAULT_LEASE_MS", "TRANSITIONS", "apply", "due", "new_job"]

DEFAULT_LEASE_MS = 30_000  # a claim's lease; a worker renews it while the job runs
_HELD = (JobState.CLAIMED, JobState.RUNNING)

TRANSITIONS: dict[JobEvent, tuple[JobState, ...]] = {
    JobEvent.CLAIM: (JobState.PENDING,),
    JobEvent.START: (JobState.CLAIMED,),
    JobEvent.RENEW: _HELD,
    JobEvent.STOP: _HELD,
    JobEvent.RELEASE: _HELD,
    JobEvent.RETURN: _HELD,
    JobEvent.EXPIRE: (JobState.PENDING, *_HELD),
    JobEvent.CANCEL: (JobState.PENDING, *_HELD),
}


def new_job(spec: JobSubmit, now_ms: int) -> Job:
    return Job(
        name=spec.name,
        app=spec.app or DEFAULT_QUEUE,
        state=JobState.PENDING,
        spec=spec,
        submitted_ms=now_ms,
        updated_ms=now_ms,
        why="submitted",
    )


def due(job: Job, now_ms: int) -> bool:
    """Whether ``expire`` applies now: a held job past its lease, or any live job past its
    deadline."""
    if job.state.ended:
        return False
    deadline = job.deadline_ms
    if deadline is not None and now_ms >= deadline:
        return True
    return job.state in _HELD and job.lease_until_ms is not None and now_ms >= job.lease_until_ms


def apply(
    job: Job,
    event: JobEvent,
    now_ms: int,
    *,
    worker: str | None = None,
    lease_ms: int = DEFAULT_LEASE_MS,
    stopped: JobStopped | None = None,
) -> Job:
    """``job`` after ``event`` at ``now_ms``; ``worker`` is who asks (None: anyone, as the
    seed's API has no names)."""
    allowed = TRANSITIONS[event]
    if job.state not in allowed:
        raise IllegalTransition(
            f"job {job.name} is {job.state}: it cannot {event}",
            hint=f"{event} applies to a job that is {' or '.join(allowed)}",
            details={"state": str(job.state), "event": str(event)},
        )
    if event not in (JobEvent.CLAIM, JobEvent.EXPIRE, JobEvent.CANCEL):
        _check_holder(job, worker)
    change: dict[str, Any] = {"updated_ms": now_ms}
    if event is JobEvent.CLAIM:
        change |= _claim(job, now_ms, worker, lease_ms)
    elif event is JobEvent.START:
        change |= _start(job, now_ms, lease_ms)
    elif event is JobEvent.RENEW:
        change |= {"lease_until_ms": now_ms + lease_ms}
    elif event is JobEvent.STOP:
        change |= _stop(job, now_ms, stopped or JobStopped())
    elif event is JobEvent.RELEASE:
        # The seed's worker claims, runs and releases, never saying it started: its run is
        # counted here, so that the restart policy sees it.
        ran = job if job.state is JobState.RUNNING else job.model_copy(update=_start(job, now_ms))
        change |= {"attempts": ran.attempts, "started_ms": ran.started_ms}
        change |= _stop(ran, now_ms, stopped or JobStopped())
    elif event is JobEvent.RETURN:
        change |= _requeue(job, now_ms, f"returned by {job.worker}")
    elif event is JobEvent.EXPIRE:
        change |= _expire(job, now_ms)
    else:
        change |= _cancel(job, now_ms)
    return job.model_copy(update=change)


def _check_holder(job: Job, worker: str | None) -> None:
    if worker is not None and job.worker is not None and worker != job.worker:
        raise IllegalTransition(
            f"job {job.name} is held by {job.worker}, not {worker}",
            hint="only the worker that claimed it may start, renew, stop, release or return it",
            details={"holder": job.worker},
        )


def _start(job: Job, now_ms: int, lease_ms: int = DEFAULT_LEASE_MS) -> dict[str, Any]:
    return {
        "state": JobState.RUNNING,
        "attempts": job.attempts + 1,
        "started_ms": now_ms,
        "lease_until_ms": now_ms + lease_ms,
        "why": f"started by {job.worker}",
    }


def _claim(job: Job, now_ms: int, worker: str | None, lease_ms: int) -> dict[str, Any]:
    if job.not_before_ms > now_ms:
        raise IllegalTransition(
            f"job {job.name} waits {job.not_before_ms - now_ms} ms before its next try",
            hint="claim it after its backoff",
            details={"not_before_ms": job.not_before_ms},
        )
    who = worker or "anonymous"
    return {
        "state": JobState.CLAIMED,
        "worker": who,
        "lease_until_ms": now_ms + lease_ms,
        "why": f"claimed by {who}",
    }


def _ended(state: JobState, now_ms: int, why: str, **more: Any) -> dict[str, Any]:
    # ``worker`` stays: who ran it last (None if nobody held it).
    return {
        "state": state,
        "finished_ms": now_ms,
        "lease_until_ms": None,
        "why": why,
        **more,
    }


def _requeue(job: Job, now_ms: int, why: str, *, wait_ms: int = 0) -> dict[str, Any]:
    return {
        "state": JobState.PENDING,
        "worker": None,
        "lease_until_ms": None,
        "not_before_ms": now_ms + wait_ms,
        "why": why,
    }


def _stop(job: Job, now_ms: int, stopped: JobStopped) -> dict[str, Any]:
    outcome = {"exit_code": stopped.exit_code, "error": stopped.error}
    if job.cancel_requested:
        deadline = job.deadline_ms
        if deadline is not None and now_ms >= deadline:  # stopped because its time was up
            return _ended(JobState.FAILED, now_ms, "its deadline passed", **outcome)
        return _ended(JobState.CANCELLED, now_ms, "cancelled: its worker stopped it", **outcome)
    if stopped.exit_code == 0 and not stopped.error:
        return _ended(JobState.SUCCEEDED, now_ms, "exited 0", **outcome)
    failed = f"exited {stopped.exit_code}" + (f": {stopped.error}" if stopped.error else "")
    spec = job.spec
    if spec.restart == "on-failure" and job.attempts <= spec.max_retries:
        wait = int(spec.backoff_s * 1000 * 2 ** max(job.attempts - 1, 0))
        return {**_requeue(job, now_ms, f"{failed}; retry in {wait} ms", wait_ms=wait), **outcome}
    return _ended(JobState.FAILED, now_ms, failed, **outcome)


def _expire(job: Job, now_ms: int) -> dict[str, Any]:
    deadline = job.deadline_ms
    if deadline is not None and now_ms >= deadline:
        if job.state is JobState.PENDING or (
            job.lease_until_ms is not None and now_ms >= job.lease_until_ms
        ):
            return _ended(JobState.FAILED, now_ms, "its deadline passed")
        # Held and its worker still renewing: ask the worker to stop it.
        return {"cancel_requested": True, "why": "its deadline passed: its worker stops it"}
    if job.state is JobState.PENDING:
        raise IllegalTransition(
            f"job {job.name} is pending and within its deadline", hint="nothing expired"
        )
    if job.lease_until_ms is None or now_ms < job.lease_until_ms:
        raise IllegalTransition(
            f"job {job.name}'s lease runs {job.lease_until_ms} ms", hint="nothing expired"
        )
    if job.cancel_requested:
        return _ended(JobState.CANCELLED, now_ms, "cancelled: its worker's lease ran out")
    return _requeue(job, now_ms, f"the lease of {job.worker} ran out: waiting again")


def _cancel(job: Job, now_ms: int) -> dict[str, Any]:
    if job.state is JobState.PENDING:
        return _ended(JobState.CANCELLED, now_ms, "cancelled before it ran")
    return {"cancel_requested": True, "why": f"cancel asked: {job.worker} stops it"}
