"""A job's changes named from its records, as the event stream tells them: every path through
the state table gives one change per step a reader would see, and a lease renewed gives none;
the watch that feeds them, and the event they become."""

from __future__ import annotations

from nats.js.kv import KeyValue

from souq.clock import VirtualClock
from souq.jobs.changes import JobMark, change_of, mark
from souq.jobs.core import apply, new_job
from souq.jobs.watch import JobWatch
from souq.model.job import Job, JobChange, JobEvent, JobState, JobStopped, JobSubmit
from souq.view import EventLog


def _job(**spec: object) -> Job:
    return new_job(JobSubmit.model_validate({"name": "j", "command": "true", **spec}), 1_000)


def _told(steps: list[Job], before: JobMark | None = None) -> list[JobChange | None]:
    told = []
    for job in steps:
        told.append(change_of(before, job))
        before = mark(job)
    return told


def test_a_run_from_submit_to_success() -> None:
    submitted = _job()
    claimed = apply(submitted, JobEvent.CLAIM, 2_000, worker="w")
    started = apply(claimed, JobEvent.START, 2_100, worker="w")
    renewed = apply(started, JobEvent.RENEW, 2_200, worker="w")
    done = apply(renewed, JobEvent.STOP, 2_300, worker="w")
    assert _told([submitted, claimed, started, renewed, done]) == [
        JobChange.SUBMITTED,
        JobChange.CLAIMED,
        JobChange.STARTED,
        None,  # a lease renewed: nothing to tell
        JobChange.SUCCEEDED,
    ]


def test_a_retry_is_requeued_then_started_again_then_fails() -> None:
    job = _job(restart="on-failure", max_retries=1, backoff_s=0)
    steps = [job]
    for t in (2_000, 3_000):
        job = apply(job, JobEvent.CLAIM, t, worker="w")
        job = apply(job, JobEvent.START, t, worker="w")
        failed = JobStopped(exit_code=1)
        steps += [job, apply(job, JobEvent.STOP, t + 1, worker="w", stopped=failed)]
        job = steps[-1]
    assert _told(steps) == [
        JobChange.SUBMITTED,
        JobChange.STARTED,  # (the watcher saw the claim and the start as one step)
        JobChange.REQUEUED,
        JobChange.STARTED,
        JobChange.FAILED,
    ]


def test_cancels_of_a_waiting_and_of_a_running_job() -> None:
    waiting = _job()
    assert _told([waiting, apply(waiting, JobEvent.CANCEL, 2_000)]) == [
        JobChange.SUBMITTED,
        JobChange.CANCELLED,
    ]
    running = apply(apply(_job(), JobEvent.CLAIM, 2_000, worker="w"), JobEvent.START, 2_000)
    asked = apply(running, JobEvent.CANCEL, 3_000)
    again = apply(asked, JobEvent.CANCEL, 3_100)  # a second cancel: nothing new
    stopped = apply(again, JobEvent.STOP, 3_200, stopped=JobStopped(exit_code=-15))
    assert _told([asked, again, stopped], mark(running)) == [
        JobChange.CANCEL_REQUESTED,
        None,
        JobChange.CANCELLED,
    ]


def test_a_lease_run_out_or_a_return_requeues() -> None:
    claimed = apply(_job(), JobEvent.CLAIM, 2_000, worker="w", lease_ms=1_000)
    assert change_of(mark(claimed), apply(claimed, JobEvent.EXPIRE, 3_000)) is JobChange.REQUEUED
    returned = apply(claimed, JobEvent.RETURN, 2_500, worker="w")
    assert change_of(mark(claimed), returned) is JobChange.REQUEUED
    other = apply(returned, JobEvent.CLAIM, 2_600, worker="w2")
    assert change_of(mark(returned), other) is JobChange.CLAIMED


def test_a_job_first_seen_late_is_told_by_its_state() -> None:
    """A watcher that meets a job only now (it came back from an outage) names its state."""
    claimed = apply(_job(), JobEvent.CLAIM, 2_000, worker="w")
    requeued = apply(claimed, JobEvent.RETURN, 2_500, worker="w")
    assert change_of(None, requeued) is JobChange.REQUEUED
    assert change_of(None, claimed) is JobChange.CLAIMED
    ended = apply(requeued, JobEvent.CANCEL, 2_600)
    assert ended.state is JobState.CANCELLED
    assert change_of(None, ended) is JobChange.CANCELLED
    assert change_of(mark(ended), ended) is None


def test_the_watch_tells_changes_but_not_the_queue_it_found() -> None:
    """The first records a broker's watch gets are history, told only if they changed since
    the watch began; every later record is told by its change (and a renewal is not)."""
    told: list[tuple[str, JobChange, JobState | None]] = []

    async def no_bucket() -> KeyValue:
        raise AssertionError("not used")

    watch = JobWatch(
        no_bucket,
        lambda job, change, before: told.append((job.name, change, before and before.state)),
        lambda: 0,
        clock=VirtualClock(start_ms=1_500),
    )
    old = _job()  # changed at 1_000, before the watch began
    watch.on_record("j", old.model_dump_json().encode(), history=True)
    late = new_job(JobSubmit(name="late", command="true"), 2_000)
    watch.on_record("late", late.model_dump_json().encode(), history=True)
    claimed = apply(old, JobEvent.CLAIM, 3_000, worker="w")
    for job in (claimed, apply(claimed, JobEvent.RENEW, 3_100, worker="w")):
        watch.on_record("j", job.model_dump_json().encode())
    watch.on_record("j", b"{not json")  # logged and skipped
    assert told == [
        ("late", JobChange.SUBMITTED, None),
        ("j", JobChange.CLAIMED, JobState.PENDING),
    ]


def test_a_job_event_in_the_brokers_stream() -> None:
    log = EventLog(capacity=10)
    ended = apply(apply(_job(), JobEvent.CLAIM, 2_000, worker="w"), JobEvent.START, 2_100)
    ended = apply(ended, JobEvent.STOP, 2_200, stopped=JobStopped(exit_code=4))
    event = log.append_job(ended, JobChange.FAILED, previous=JobState.RUNNING, worker="w")
    assert (event.kind, event.state, event.previous, event.worker_id) == (
        "job",
        JobState.FAILED,
        JobState.RUNNING,
        "w",
    )
    assert event.job is not None
    assert (event.job.name, event.job.type, event.job.exit_code) == ("j", "failed", 4)
    body = event.model_dump(mode="json")
    assert body["state"] == "failed" and body["job"]["why"] == "exited 4"
    assert log.since(0, worker="w") == [event]
    assert log.since(0, app="web") == []  # an app's events are its machines'
