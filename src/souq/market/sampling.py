"""Sampling at scale: past ``sample_above`` workers in a region, ask a random sample for offers
instead of everyone (Sparrow's batch sampling: ``d x m`` workers for ``m`` machines).

Asking everyone costs one message, one handler and one offer to decode per worker per
placement: at a thousand workers that is most of a placement's work, and most offers lose.
Sparrow showed that probing ``d x m`` random workers for ``m`` tasks places nearly as well as
probing all of them; Nomad scores only about ``log2(N)`` nodes. The trade-off we measured is in
docs/benchmarks.md.

The sample is drawn from the region's ``up`` workers (as the broker's liveness table knows
them, sorted by id) with a generator seeded from the request id, so every broker that sees the
same workers asks the same ones for the same request: a retried idempotent create meets the
worker that already made its machine. Pure: no I/O.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SamplePlan", "plan_sample"]


@dataclass(frozen=True)
class SamplePlan:
    """Whom to ask. ``workers`` is None when everyone is asked (on the region's subject)."""

    workers: list[str] | None
    population: int

    @property
    def sampled(self) -> bool:
        return self.workers is not None


def plan_sample(
    seed: str,
    population: Sequence[str],
    *,
    machines: int = 1,
    slots: int = 1,
    above: int,
    factor_d: float,
    minimum: int,
) -> SamplePlan:
    """Ask everyone while ``len(population) <= above``; otherwise a seeded random sample of
    ``max(minimum, ceil(factor_d x machines / slots))`` workers (all of them if that is more).
    ``slots`` is how many of the machines one worker can typically take: Sparrow's workers
    run one task each, ours many, so a batch needs ``d`` offers per worker's worth of
    machines, not per machine. ``population`` must be in the same order on every broker
    (sorted ids)."""
    n = len(population)
    if n <= above:
        return SamplePlan(workers=None, population=n)
    k = min(n, max(minimum, math.ceil(factor_d * machines / max(1, slots))))
    return SamplePlan(workers=random.Random(seed).sample(population, k), population=n)
