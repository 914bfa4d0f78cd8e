"""A job's state table: what each event does from each state, and what it refuses."""

from __future__ import annotations

import pytest

from souq.errors import IllegalTransition
from souq.jobs.core import TRANSITIONS, apply, due, new_job
from souq.model.job import JobEvent, JobState, JobStopped, JobSubmit


def _job(**spec: object):  # type: ignore[no-untyped-def]
    return new_job(JobSubmit(name="j", command="true", **spec), 1_000)  # type: ignore[arg-type]


def test_a_run_from_claim_to_success() -> None:
    job = apply(_job(), JobEvent.CLAIM, 2_000, worker="w", lease_ms=5_000)
    assert (job.state, job.worker, job.lease_until_ms) == (JobState.CLAIMED, "w", 7_000)
    job = apply(job, JobEvent.START, 3_000, worker="w", lease_ms=5_000)
    assert (job.state, job.attempts, job.started_ms) == (JobState.RUNNING, 1, 3_000)
    job = apply(job, JobEvent.RENEW, 6_000, worker="w", lease_ms=5_000)
    assert job.lease_until_ms == 11_000
    job = apply(job, JobEvent.STOP, 7_000, worker="w")
    assert (job.state, job.worker, job.exit_code) == (JobState.SUCCEEDED, "w", 0)  # who ran it


@pytest.mark.parametrize("event", list(JobEvent))
def test_every_event_refused_outside_its_states(event: JobEvent) -> None:
    ended = apply(_job(), JobEvent.CANCEL, 2_000)
    assert ended.state is JobState.CANCELLED
    assert ended.state not in TRANSITIONS[event]
    with pytest.raises(IllegalTransition) as err:
        apply(ended, event, 3_000, worker="w")
    assert err.value.http_status == 409 and "cancelled" in str(err.value)


def test_only_the_holder_moves_a_held_job() -> None:
    job = apply(_job(), JobEvent.CLAIM, 2_000, worker="w1")
    with pytest.raises(IllegalTransition, match="held by w1"):
        apply(job, JobEvent.START, 2_100, worker="w2")
    assert apply(job, JobEvent.START, 2_100).state is JobState.RUNNING  # unnamed: the seed's way


def test_a_failure_retries_with_a_doubling_backoff_then_fails() -> None:
    job = _job(restart="on-failure", max_retries=2, backoff_s=1)
    waits = []
    for t in (10_000, 20_000, 30_000):
        job = apply(apply(job, JobEvent.CLAIM, t, worker="w"), JobEvent.START, t, worker="w")
        job = apply(job, JobEvent.STOP, t + 1, worker="w", stopped=JobStopped(exit_code=3))
        waits.append(job.not_before_ms - (t + 1) if job.state is JobState.PENDING else None)
    assert waits == [1_000, 2_000, None]
    assert (job.state, job.attempts, job.exit_code) == (JobState.FAILED, 3, 3)
    early = _job(restart="on-failure", backoff_s=5)
    early = apply(apply(early, JobEvent.CLAIM, 0, worker="w"), JobEvent.START, 0, worker="w")
    early = apply(early, JobEvent.STOP, 1, worker="w", stopped=JobStopped(exit_code=1))
    with pytest.raises(IllegalTransition, match="before its next try"):
        apply(early, JobEvent.CLAIM, 2, worker="w")


def test_a_lease_that_ran_out_requeues_or_ends_a_cancelled_job() -> None:
    job = apply(_job(), JobEvent.CLAIM, 2_000, worker="w", lease_ms=1_000)
    assert not due(job, 2_500) and due(job, 3_000)
    with pytest.raises(IllegalTransition, match="nothing expired"):
        apply(job, JobEvent.EXPIRE, 2_500)
    back = apply(job, JobEvent.EXPIRE, 3_000)
    assert (back.state, back.worker) == (JobState.PENDING, None)
    asked = apply(job, JobEvent.CANCEL, 2_100)
    assert asked.cancel_requested and asked.state is JobState.CLAIMED
    assert apply(asked, JobEvent.EXPIRE, 3_000).state is JobState.CANCELLED


def test_a_deadline_fails_a_waiting_job_and_asks_a_running_one_to_stop() -> None:
    job = _job(deadline_s=2)  # submitted at 1_000: due at 3_000
    assert due(job, 3_000) and not due(job, 2_999)
    assert apply(job, JobEvent.EXPIRE, 3_000).state is JobState.FAILED
    running = apply(
        apply(job, JobEvent.CLAIM, 1_500, worker="w", lease_ms=10_000),
        JobEvent.START,
        1_600,
        worker="w",
        lease_ms=10_000,
    )
    asked = apply(running, JobEvent.EXPIRE, 3_000)
    assert asked.state is JobState.RUNNING and asked.cancel_requested


def test_a_run_stopped_past_its_deadline_fails_and_a_cancelled_one_is_cancelled() -> None:
    job = _job(deadline_s=2)  # submitted at 1_000: due at 3_000
    running = apply(
        apply(job, JobEvent.CLAIM, 1_500, worker="w", lease_ms=10_000),
        JobEvent.START,
        1_600,
        worker="w",
        lease_ms=10_000,
    )
    asked = apply(running, JobEvent.EXPIRE, 3_000)  # the sweep asks its worker to stop it
    ended = apply(asked, JobEvent.STOP, 3_200, worker="w", stopped=JobStopped(exit_code=-15))
    assert (ended.state, ended.why, ended.exit_code) == (
        JobState.FAILED,
        "its deadline passed",
        -15,
    )
    cancelled = apply(running, JobEvent.CANCEL, 2_000)  # a user's cancel, within the deadline
    stopped = apply(cancelled, JobEvent.STOP, 2_100, worker="w", stopped=JobStopped(exit_code=-15))
    assert stopped.state is JobState.CANCELLED


def test_a_release_ends_the_run_as_the_seed_says() -> None:
    """Claim, run, release: the run is counted and ended; it runs again only under on-failure."""
    claimed = apply(_job(), JobEvent.CLAIM, 2_000, worker="w")
    done = apply(claimed, JobEvent.RELEASE, 3_000, worker="w")
    assert (done.state, done.attempts, done.exit_code, done.started_ms, done.finished_ms) == (
        JobState.SUCCEEDED,
        1,
        0,
        3_000,
        3_000,
    )
    failed = apply(claimed, JobEvent.RELEASE, 3_000, stopped=JobStopped(exit_code=4))
    assert (failed.state, failed.attempts, failed.exit_code) == (JobState.FAILED, 1, 4)
    started = apply(claimed, JobEvent.START, 2_500, worker="w")
    after = apply(started, JobEvent.RELEASE, 3_000, worker="w")
    assert (after.state, after.attempts, after.started_ms) == (JobState.SUCCEEDED, 1, 2_500)
    retried = _job(restart="on-failure", max_retries=1, backoff_s=0)
    retried = apply(retried, JobEvent.CLAIM, 2_000, worker="w")
    retried = apply(retried, JobEvent.RELEASE, 2_100, stopped=JobStopped(exit_code=1))
    assert (retried.state, retried.attempts, retried.worker) == (JobState.PENDING, 1, None)
    retried = apply(retried, JobEvent.CLAIM, 2_200, worker="w2")
    retried = apply(retried, JobEvent.RELEASE, 2_300, stopped=JobStopped(exit_code=1))
    assert (retried.state, retried.attempts, retried.exit_code) == (JobState.FAILED, 2, 1)
    with pytest.raises(IllegalTransition, match="held by w"):
        apply(claimed, JobEvent.RELEASE, 3_000, worker="other")


def test_a_return_gives_the_job_back_untouched() -> None:
    claimed = apply(_job(), JobEvent.CLAIM, 2_000, worker="w")
    back = apply(claimed, JobEvent.RETURN, 2_500, worker="w")
    assert (back.state, back.attempts, back.worker, back.why) == (
        JobState.PENDING,
        0,
        None,
        "returned by w",
    )
    running = apply(claimed, JobEvent.START, 2_100, worker="w")
    back = apply(running, JobEvent.RETURN, 2_500, worker="w")
    assert (back.state, back.attempts) == (JobState.PENDING, 1)  # the run began: it counts
