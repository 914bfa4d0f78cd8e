"""Restart decisions: policies, retry limits, backoff with a cap, counter reset, user stops."""

from __future__ import annotations

import pytest

from souq.agent.machines.restart import Backoff, Decision, decide
from souq.model import RestartConfig, RestartPolicy

BACKOFF = Backoff(base_s=0.1, max_s=1.0, reset_after_s=10.0)


def run(
    policy: RestartPolicy,
    *,
    exit_code: int | None,
    restarts: int = 0,
    max_retries: int = 3,
    user_stop: bool = False,
    ran_for_s: float = 1.0,
) -> Decision:
    return decide(
        RestartConfig(policy=policy, max_retries=max_retries),
        exit_code=exit_code,
        user_stop=user_stop,
        restarts=restarts,
        ran_for_s=ran_for_s,
        backoff=BACKOFF,
    )


def test_policy_no_never_restarts() -> None:
    for code in (0, 1, None):
        decision = run(RestartPolicy.NO, exit_code=code)
        assert not decision.restart
        assert "no" in decision.reason


def test_on_failure_restarts_after_a_non_zero_exit() -> None:
    decision = run(RestartPolicy.ON_FAILURE, exit_code=1)
    assert decision.restart
    assert decision.delay_s == pytest.approx(0.1)
    assert decision.restarts == 1
    assert "restart 1 of 3" in decision.reason


def test_on_failure_counts_a_death_by_signal_or_an_unknown_status_as_failure() -> None:
    assert run(RestartPolicy.ON_FAILURE, exit_code=None).restart


def test_on_failure_stays_down_after_a_clean_exit() -> None:
    decision = run(RestartPolicy.ON_FAILURE, exit_code=0)
    assert not decision.restart
    assert "code 0" in decision.reason


def test_on_failure_gives_up_after_max_retries() -> None:
    assert run(RestartPolicy.ON_FAILURE, exit_code=1, restarts=2, max_retries=3).restart
    decision = run(RestartPolicy.ON_FAILURE, exit_code=1, restarts=3, max_retries=3)
    assert not decision.restart
    assert decision.restarts == 3
    assert "gave up after 3 restarts" in decision.reason
    assert not run(RestartPolicy.ON_FAILURE, exit_code=1, max_retries=0).restart


def test_always_restarts_even_after_success_and_past_max_retries() -> None:
    assert run(RestartPolicy.ALWAYS, exit_code=0).restart
    assert run(RestartPolicy.ALWAYS, exit_code=1, restarts=50, max_retries=1).restart


def test_a_user_stop_never_restarts() -> None:
    for policy in RestartPolicy:
        decision = run(policy, exit_code=1, user_stop=True)
        assert not decision.restart
        assert decision.reason == "stopped on request"


def test_backoff_doubles_up_to_the_cap() -> None:
    delays = [run(RestartPolicy.ALWAYS, exit_code=1, restarts=n).delay_s for n in range(6)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert BACKOFF.delay(10_000) == 1.0
    assert BACKOFF.delay(-1) == pytest.approx(0.1)


def test_the_counter_resets_after_a_long_enough_run() -> None:
    decision = run(RestartPolicy.ON_FAILURE, exit_code=1, restarts=3, ran_for_s=10.0)
    assert decision.restart
    assert decision.restarts == 1
    assert decision.delay_s == pytest.approx(0.1)
    short = run(RestartPolicy.ON_FAILURE, exit_code=1, restarts=3, ran_for_s=9.9)
    assert not short.restart
