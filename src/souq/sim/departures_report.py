"""What a replay with departures reports (:mod:`souq.sim.departures`): the samples, each
task's outcome, and the report with its summary over time and its figures per priority class.

Pure.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from souq.sim.classes import ClassesTold

__all__ = ["Outcome", "Report", "Sample", "pct", "percentile"]


def percentile(values: np.ndarray[Any, Any], p: float) -> float:
    """The nearest-rank ``p``-th percentile: the smallest value with at least ``p`` % of the
    values at or below it (0 for no values)."""
    n = len(values)
    if n == 0:
        return 0.0
    k = max(1, math.ceil(p / 100 * n)) - 1
    return float(np.partition(values, k)[k])


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster at virtual time ``t`` (seconds from the trace's start): allocation %, and
    the workers' CPU utilisation (reserved / capacity, %) as percentiles over the workers."""

    t: float
    running: int
    cpu: float
    memory: float
    gpu: float
    worker_cpu_p50: float
    worker_cpu_p95: float
    worker_cpu_max: float


@dataclass(frozen=True, slots=True)
class Outcome:
    """One task: the worker that took it, or why none did."""

    task: str
    worker: str | None
    reason: str | None = None


@dataclass(frozen=True)
class Report(ClassesTold):
    policy: str
    workers: int
    tasks: int
    placed: int
    failed_by_reason: dict[str, int]
    samples: list[Sample]
    outcomes: list[Outcome] = field(repr=False)
    has_gpus: bool = False  # whether the workers have GPUs (else no GPU figure is told)
    hot_threshold: float = 0.9  # a fraction of a worker's capacity
    # Per resource (cpu, memory; gpu where the workers have GPUs): the share of worker-time
    # above ``hot_threshold``, %; each worker's time-averaged utilisation, p95 and max, %.
    hot: dict[str, float] = field(default_factory=dict)
    host_utilisation: dict[str, float] = field(default_factory=dict)
    # Per priority class (ClassTally.as_json); the most machines one create may displace.
    classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    preempt: int = 0
    # Allocated over capacity, % per resource, averaged over a fixed span (the trace's own
    # unless the replay was given one): runs of one trace compare over it.
    window_s: tuple[float, float] = (0.0, 0.0)
    window_utilisation: dict[str, float] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return sum(self.failed_by_reason.values())

    def summary(self) -> dict[str, float]:
        """Over the samples, weighted by time (each holds until the next; all alike when they
        share one instant): the mean allocation %, and the mean and peak of the workers' p95
        and max CPU utilisation. No ``gpu_mean`` when the workers have no GPUs."""
        if not self.samples:
            return {}
        times = [s.t for s in self.samples]
        held = [b - a for a, b in itertools.pairwise(times)] + [0.0]
        span = sum(held)
        weights = held if span > 0 else [1.0] * len(self.samples)
        whole = span if span > 0 else float(len(self.samples))

        def mean(name: str) -> float:
            total = sum(
                float(getattr(s, name)) * w for s, w in zip(self.samples, weights, strict=True)
            )
            return round(total / whole, 3)

        def peak(name: str) -> float:
            return round(max(float(getattr(s, name)) for s in self.samples), 3)

        gpu = {"gpu_mean": mean("gpu")} if self.has_gpus else {}
        return {
            "cpu_mean": mean("cpu"),
            "memory_mean": mean("memory"),
            **gpu,
            "worker_cpu_p95_mean": mean("worker_cpu_p95"),
            "worker_cpu_p95_peak": peak("worker_cpu_p95"),
            "worker_cpu_max_mean": mean("worker_cpu_max"),
        }

    def as_json(self, *, samples: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {
            "policy": self.policy,
            "workers": self.workers,
            "tasks": self.tasks,
            "placed": self.placed,
            "failed": self.failed,
            "failed_by_reason": dict(sorted(self.failed_by_reason.items())),
            "summary": self.summary(),
            "hot_threshold": self.hot_threshold,
            "hot": self.hot,
            "host_utilisation": self.host_utilisation,
            "preempt_max_victims": self.preempt,
            "preemptions": self.preemptions,
            "classes": self.classes,
            "window_s": list(self.window_s),
            "window_utilisation": self.window_utilisation,
        }
        if samples:
            body["samples"] = [asdict(s) for s in self.samples]
        return body


def pct(used: int, total: int) -> float:
    """``used`` of ``total`` in %, to three places (0 of nothing)."""
    return round(100 * used / total, 3) if total else 0.0
