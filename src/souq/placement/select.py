"""Selectors: the steps that choose among feasible offers once filters have run.

* :func:`shuffled` — a random order seeded from the request id: equal scores then break ties at
  random, yet the same request always ranks the same way.
* :func:`limit` — keep the first ``n`` feasible offers of that order: a seeded sample, so a broker
  can score a few (``n = 2`` is power-of-two-choices) instead of all.
* :func:`weighted_mean` — normalise: one final score in [0, 1] from the bounded scores, each
  weighted, leaving out scorers with no opinion.
* :func:`best_first` — pick: order by final score, highest first; a stable sort keeps the seeded
  order among equals.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

__all__ = ["best_first", "limit", "shuffled", "weighted_mean"]

T = TypeVar("T")


def shuffled(items: Iterable[T], seed: str) -> list[T]:
    pool = list(items)
    random.Random(seed).shuffle(pool)
    return pool


def limit(items: Sequence[T], n: int | None) -> tuple[list[T], list[T]]:
    """(the first ``n`` items, the rest); all of them when ``n`` is None."""
    if n is None:
        return list(items), []
    return list(items[:n]), list(items[n:])


def weighted_mean(scores: Mapping[str, float | None], weights: Mapping[str, float]) -> float:
    """The mean of ``scores`` weighted by ``weights``; a ``None`` score is left out (its weight
    too). 0 when nothing scored."""
    total = weight_sum = 0.0
    for name, score in scores.items():
        weight = weights.get(name, 0.0)
        if score is None or weight <= 0:
            continue
        total += weight * score
        weight_sum += weight
    return total / weight_sum if weight_sum > 0 else 0.0


def best_first(scored: Iterable[tuple[float, T]]) -> list[tuple[float, T]]:
    return sorted(scored, key=lambda item: item[0], reverse=True)
