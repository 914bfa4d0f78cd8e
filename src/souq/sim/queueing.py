"""Where short tasks would wait under other schedulers: the yardsticks of the batch-jobs
benchmark (Sparrow's comparison, Ousterhout et al., SOSP '13).

Given when each task arrived and how long it ran, and ``k`` workers of one slot each (FIFO),
:func:`responses` replays them under a placement rule and returns each task's response time
(wait + run):

* ``ideal`` — infinite knowledge: one central queue, each task to the first worker free (a task
  waits only when every worker is busy). Nothing placed at arrival does better.
* ``random`` — each task to a worker drawn at random, queued there.
* ``power-of-two`` — two workers drawn at random, the task to the one with fewer tasks queued
  or running at that moment (Sparrow's per-task sampling, d = 2).

Pure and seeded; the same arrivals and run times go through each rule, and the benchmark puts
the real run beside them.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections.abc import Sequence
from typing import Literal

__all__ = ["RULES", "Rule", "responses"]

Rule = Literal["ideal", "random", "power-of-two"]
RULES: tuple[Rule, ...] = ("ideal", "random", "power-of-two")


def responses(
    arrivals: Sequence[float], runs: Sequence[float], workers: int, rule: Rule, *, seed: int = 0
) -> list[float]:
    """Each task's response time (seconds) under ``rule``; tasks in arrival order."""
    if len(arrivals) != len(runs):
        raise ValueError("one run time per arrival")
    if workers < 1:
        raise ValueError("at least one worker")
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i])
    out = [0.0] * len(arrivals)
    if rule == "ideal":
        free = [0.0] * workers  # when each worker is next free (a heap)
        for i in order:
            start = max(arrivals[i], heapq.heappop(free))
            heapq.heappush(free, start + runs[i])
            out[i] = start + runs[i] - arrivals[i]
        return out
    rng = random.Random(seed)
    ends: list[list[float]] = [[] for _ in range(workers)]  # each worker's task end times, sorted
    for i in order:
        t = arrivals[i]
        if rule == "random":
            w = rng.randrange(workers)
        else:
            a, b = rng.sample(range(workers), 2) if workers > 1 else (0, 0)
            w = a if _busy(ends[a], t) <= _busy(ends[b], t) else b
        start = max(t, ends[w][-1] if ends[w] else 0.0)
        ends[w].append(start + runs[i])
        out[i] = start + runs[i] - t
    return out


def _busy(ends: list[float], t: float) -> int:
    """Tasks queued or running at ``t`` on a worker whose task end times are ``ends``."""
    return len(ends) - bisect.bisect_right(ends, t)
