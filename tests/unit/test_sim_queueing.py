"""The batch benchmark's yardsticks: a central queue (ideal), random placement and power of
two, on the same arrivals and run times."""

from __future__ import annotations

import random
import statistics

import pytest

from souq.sim.queueing import RULES, responses


def test_the_ideal_queue_waits_only_when_every_worker_is_busy() -> None:
    assert responses([0, 0, 0], [1, 1, 1], 2, "ideal") == [1, 1, 2]
    assert responses([0, 5], [1, 1], 1, "ideal") == [1, 1]


@pytest.mark.parametrize("rule", RULES)
def test_one_worker_is_one_fifo_queue(rule: str) -> None:
    assert responses([0, 0.5, 1], [1, 1, 1], 1, rule) == [1, 1.5, 2]  # type: ignore[arg-type]


def test_power_of_two_sends_a_task_to_the_idle_worker_of_the_two() -> None:
    # Worker 0 or 1 gets the long task; the next task, seeing both, goes to the idle one.
    out = responses([0, 0.1], [10, 1], 2, "power-of-two", seed=3)
    assert out == [10, 1]


def test_at_80_percent_load_the_rules_order_as_sparrow_found() -> None:
    rng = random.Random(1)
    workers, mean_run, n = 100, 1.0, 20_000
    rate = 0.8 * workers / mean_run
    t, arrivals = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
    runs = [rng.expovariate(1 / mean_run) for _ in range(n)]
    median = {r: statistics.median(responses(arrivals, runs, workers, r, seed=2)) for r in RULES}
    p99 = {
        r: statistics.quantiles(responses(arrivals, runs, workers, r, seed=2), n=100)[98]
        for r in RULES
    }
    assert median["ideal"] < median["power-of-two"] < median["random"]
    assert p99["ideal"] < p99["power-of-two"] < p99["random"]
    assert median["ideal"] == pytest.approx(statistics.median(runs), rel=0.05)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="one run time per arrival"):
        responses([0, 1], [1], 2, "ideal")
    with pytest.raises(ValueError, match="at least one worker"):
        responses([0], [1], 0, "ideal")
