"""Priority classes in a replay: the trace's QoS classes as Souq's, and what each class saw.

A trace names a task's class directly (a ``priority_class`` column: ``reserved``, ``standard``,
``spot``) or through its QoS class (a ``qos`` column, as the ATC'23 openb trace has), mapped by
:data:`QOS_CLASSES`:

======================= ============ ==================================================
QoS (trace)             class        why
======================= ============ ==================================================
``LS``, ``Guaranteed``  ``reserved`` latency-sensitive production work: never displaced
``Burstable``           ``standard`` may use more than it asked; displaced for production
``BE``, ``BestEffort``  ``spot``     best-effort batch: displaced first
======================= ============ ==================================================

(``LS``/``BE`` are Alibaba's latency-sensitive and best-effort classes; ``Guaranteed``,
``Burstable`` and ``BestEffort`` Kubernetes' QoS classes, as the openb pods carry them too.)

Who displaces whom is :mod:`souq.market.preemption`'s rule, the broker's and the workers':
the replays call it, they do not restate it. A displaced task goes back to a queue of its own
and is placed again, from the start, when room comes (:class:`ClassTally` counts the wait it
saw and the work it lost).

Pure.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from souq.model.choices import PriorityClass

__all__ = ["CLASSES", "QOS_CLASSES", "ClassTally", "ClassesTold", "Window", "class_of_qos"]

CLASSES = (PriorityClass.RESERVED, PriorityClass.STANDARD, PriorityClass.SPOT)

QOS_CLASSES: dict[str, str] = {
    "LS": PriorityClass.RESERVED,
    "Guaranteed": PriorityClass.RESERVED,
    "Burstable": PriorityClass.STANDARD,
    "BE": PriorityClass.SPOT,
    "BestEffort": PriorityClass.SPOT,
}
_FOLDED = {k.casefold(): v for k, v in QOS_CLASSES.items()}


def class_of_qos(qos: str) -> str | None:
    """The priority class of a trace's QoS class (any case); None for one not mapped."""
    return _FOLDED.get(qos.strip().casefold())


@dataclass
class ClassTally:
    """What each class's tasks saw in one replay: arrived, placed at arrival, refused at
    arrival, displaced (each time), placed again after a displacement (and the wait from the
    displacement to the new start), still waiting at the end, and the work lost (core-seconds
    that ran before a displacement: a displaced task starts over)."""

    arrived: Counter[str] = field(default_factory=Counter)
    placed: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    preempted: Counter[str] = field(default_factory=Counter)
    replaced: Counter[str] = field(default_factory=Counter)
    waiting_at_end: Counter[str] = field(default_factory=Counter)
    lost_core_s: dict[str, float] = field(default_factory=dict)
    waits: dict[str, list[float]] = field(default_factory=dict)

    def displaced(self, klass: str, *, ran_s: float, millicpus: int, count: int = 1) -> None:
        self.preempted[klass] += count
        lost = count * max(ran_s, 0.0) * millicpus / 1000
        self.lost_core_s[klass] = self.lost_core_s.get(klass, 0.0) + lost

    def placed_again(self, klass: str, wait_s: float, count: int = 1) -> None:
        self.replaced[klass] += count
        self.waits.setdefault(klass, []).extend([wait_s] * count)

    @property
    def preemptions(self) -> int:
        return sum(self.preempted.values())

    def as_json(self) -> dict[str, dict[str, Any]]:
        """Per class that arrived: counts, the refused share of arrivals (%), the displaced
        tasks' waits (s: p50, p95, max, mean over those placed again), the work lost."""
        out: dict[str, dict[str, Any]] = {}
        for klass in CLASSES:
            arrived = self.arrived[klass]
            if not arrived and not self.preempted[klass]:
                continue
            waits = np.array(self.waits.get(klass, []), dtype=np.float64)
            out[str(klass)] = {
                "arrived": arrived,
                "placed": self.placed[klass],
                "refused": self.refused[klass],
                "refused_pct": round(100 * self.refused[klass] / arrived, 3) if arrived else 0.0,
                "preempted": self.preempted[klass],
                "placed_again": self.replaced[klass],
                "waiting_at_end": self.waiting_at_end[klass],
                "preempted_wait_s": _waits(waits),
                "lost_core_s": round(self.lost_core_s.get(klass, 0.0), 3),
            }
        return out


class ClassesTold:
    """What a replay's report derives from its ``classes`` (:meth:`ClassTally.as_json`); the
    report declares the field (the fleet's and the departures replay's both do)."""

    classes: dict[str, dict[str, Any]]

    @property
    def preemptions(self) -> int:
        return sum(int(c["preempted"]) for c in self.classes.values())


@dataclass
class Window:
    """What was allocated over a fixed window of time (``start`` to ``end``, the trace's
    times), as a share of ``totals`` (millicpus, MiB, milli-GPU): runs of one trace told over
    the same window compare, whatever their own spans (a displaced task's later run makes one
    longer)."""

    start: float
    end: float
    totals: tuple[int, int, int]
    _used: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    _integral: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    _last: float = 0.0

    def __post_init__(self) -> None:
        self._last = self.start

    def change(self, t: float, cpu: int, memory: int, gpu: int) -> None:
        """At ``t``, the allocation moved by these amounts."""
        self._advance(t)
        for k, amount in enumerate((cpu, memory, gpu)):
            self._used[k] += amount

    def _advance(self, t: float) -> None:
        t = min(max(t, self.start), self.end)
        if t > self._last:
            for k in range(3):
                self._integral[k] += self._used[k] * (t - self._last)
            self._last = t

    def utilisation(self) -> dict[str, float]:
        """Allocated over capacity, averaged over the window, % (no ``gpu`` without GPUs)."""
        self._advance(self.end)
        span = self.end - self.start
        out: dict[str, float] = {}
        for k, name in enumerate(("cpu", "memory", "gpu")):
            total = self.totals[k]
            if name == "gpu" and not total:
                continue
            share = self._integral[k] / (total * span) if total and span > 0 else 0.0
            out[name] = round(100 * share, 3)
        return out


def _waits(values: np.ndarray[Any, Any]) -> dict[str, float]:
    if not len(values):
        return {"p50": 0.0, "p95": 0.0, "max": 0.0, "mean": 0.0}
    ordered = np.sort(values)

    def rank(p: float) -> float:
        k = max(1, int(np.ceil(p / 100 * len(ordered)))) - 1
        return round(float(ordered[k]), 3)

    return {
        "p50": rank(50),
        "p95": rank(95),
        "max": round(float(ordered[-1]), 3),
        "mean": round(float(ordered.mean()), 3),
    }
