"""How an agent takes a fetched job name, times its lease, and follows a run: the table."""

from __future__ import annotations

import itertools

import pytest

from souq.agent.jobs.rules import (
    RENEWING,
    TRANSITIONS,
    Action,
    LeaseTimes,
    RunEvent,
    RunState,
    Verdict,
    judge,
    later_delay_s,
    transition,
)
from souq.jobs.core import apply, new_job
from souq.model.job import Job, JobEvent, JobStopped, JobSubmit


def _job(**spec: object) -> Job:
    return new_job(JobSubmit.model_validate({"name": "j", "command": "true", **spec}), 1_000)


def test_a_waiting_job_that_fits_is_taken_and_a_stale_name_dropped() -> None:
    assert judge(_job(), 2_000, short=None).verdict is Verdict.TAKE
    assert judge(None, 2_000, short=None).verdict is Verdict.DROP
    claimed = apply(_job(), JobEvent.CLAIM, 1_500, worker="w")
    dropped = judge(claimed, 2_000, short=None)
    assert (dropped.verdict, dropped.why) == (Verdict.DROP, "it is claimed")
    late = judge(_job(deadline_s=1), 2_000, short=None)
    assert late.verdict is Verdict.DROP and "deadline" in late.why


def test_a_job_in_its_backoff_or_too_big_here_comes_back_later() -> None:
    job = _job(restart="on-failure", backoff_s=2)
    job = apply(apply(job, JobEvent.CLAIM, 1_000, worker="w"), JobEvent.START, 1_000, worker="w")
    job = apply(job, JobEvent.STOP, 1_100, worker="w", stopped=JobStopped(exit_code=1))
    waiting = judge(job, 1_600, short="insufficient cpu")
    assert (waiting.verdict, waiting.delay_s) == (Verdict.LATER, 1.5)  # the backoff first
    too_big = judge(_job(), 2_000, short="needs 64 cpus, 4 free", deliveries=3)
    assert (too_big.verdict, too_big.delay_s) == (Verdict.LATER, 1.0)
    assert "needs 64 cpus" in too_big.why
    assert [later_delay_s(n) for n in (1, 2, 3, 4, 5, 50)] == [0.25, 0.5, 1, 2, 2, 2]
    assert (later_delay_s(4, 0.0), later_delay_s(4, 0.999)) == (1.0, pytest.approx(2.998))


def test_the_lease_times_leave_the_run_dead_before_its_lease_ends() -> None:
    t = LeaseTimes(30)
    assert (t.renew_every_s, t.fence_after_s, t.kill_grace_s, t.retry_s) == (10, 22.5, 3.75, 1)
    for lease in (1, 4, 30, 3600):
        t = LeaseTimes(lease)
        # Renewed twice or more before the fence; fenced and killed before the lease ends.
        assert 2 * t.renew_every_s < t.fence_after_s
        assert t.fence_after_s + t.kill_grace_s < lease


def test_the_table_has_every_state_and_event() -> None:
    assert set(TRANSITIONS) == set(itertools.product(RunState, RunEvent))


@pytest.mark.parametrize(
    ("events", "state", "actions"),
    [
        ([RunEvent.EXITED], RunState.ENDED, [Action.KEEP_OUTPUT, Action.STOP]),
        (
            [RunEvent.CANCEL_ASKED, RunEvent.CANCEL_ASKED, RunEvent.EXITED],
            RunState.ENDED,
            [Action.TERMINATE, Action.KEEP_OUTPUT, Action.STOP],
        ),
        (
            [RunEvent.SHUTDOWN, RunEvent.EXITED],
            RunState.ENDED,
            [Action.TERMINATE, Action.KEEP_OUTPUT, Action.RETURN],
        ),
        (  # a cancel while it shuts down: the stop says cancelled
            [RunEvent.SHUTDOWN, RunEvent.CANCEL_ASKED, RunEvent.EXITED],
            RunState.ENDED,
            [Action.TERMINATE, Action.KEEP_OUTPUT, Action.STOP],
        ),
        (  # a lost lease overrides a cancel under way: killed sooner, nothing reported
            [RunEvent.CANCEL_ASKED, RunEvent.LEASE_LOST, RunEvent.CANCEL_ASKED, RunEvent.EXITED],
            RunState.ENDED,
            [Action.TERMINATE, Action.FENCE, Action.KEEP_OUTPUT, Action.RETURN],
        ),
        ([RunEvent.LEASE_ENDING], RunState.FENCED, [Action.FENCE]),
        ([RunEvent.EXITED, RunEvent.LEASE_LOST, RunEvent.CANCEL_ASKED], RunState.ENDED, None),
    ],
)
def test_a_run_through_the_table(
    events: list[RunEvent], state: RunState, actions: list[Action] | None
) -> None:
    now, done = RunState.RUNNING, []
    for event in events:
        now, more = transition(now, event)
        done += more
    assert now is state
    if actions is not None:
        assert done == actions
    else:  # after its end, late events change nothing
        assert done == [Action.KEEP_OUTPUT, Action.STOP]


def test_the_lease_is_renewed_only_while_the_job_is_ours_and_alive() -> None:
    assert frozenset({RunState.RUNNING, RunState.CANCELLING, RunState.RETURNING}) == RENEWING
