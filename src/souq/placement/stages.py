"""The stages of the placement pipeline: filters reject with a named reason; scorers add one
bounded, named score in [0, 1]."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from souq.model.protocol import Offer
from souq.model.resources import Resources
from souq.placement.curves import DEFAULT_CURVE, Curve
from souq.placement.request import PlacementRequest

__all__ = [
    "BestFitScorer",
    "EligibleFilter",
    "Filter",
    "Rejection",
    "ResourcesFilter",
    "Scorer",
    "Shortfall",
    "shortfall",
    "utilisation_after",
]


@dataclass(frozen=True)
class Rejection:
    reason: str  # a stable code, e.g. "full", "cordoned"
    detail: str  # human words


class Filter(Protocol):
    @property
    def name(self) -> str: ...

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None: ...


class Scorer(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def weight(self) -> float: ...

    def score(self, request: PlacementRequest, offer: Offer) -> float: ...


class EligibleFilter:
    """The worker itself declined (cordoned, full, draining): keep its own reason."""

    name = "eligible"

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        if offer.eligible:
            return None
        reason = offer.reason or "declined"
        return Rejection(reason, offer.detail or f"worker declined: {reason}")


@dataclass(frozen=True)
class Shortfall:
    reason: str  # a stable code: insufficient_cpu or insufficient_memory
    detail: str  # human words


def shortfall(want: Resources, capacity: Resources, allocated: Resources) -> Shortfall | None:
    """None when ``want`` fits in what ``capacity`` leaves after ``allocated``; else why not.

    The one fit rule: the broker's filter, a worker's offers (advisory) and its claims (binding)
    all use it."""
    free = capacity.minus(allocated)
    if want.millicpus > free.millicpus:
        return Shortfall(
            "insufficient_cpu",
            f"needs {want.cpus:g} cpus; {max(free.cpus, 0):g} of {capacity.cpus:g} free",
        )
    if want.memory_mb > free.memory_mb:
        left = max(free.memory_mb, 0)
        return Shortfall(
            "insufficient_memory",
            f"needs {want.memory_mb} MiB; {left} of {capacity.memory_mb} MiB free",
        )
    return None


class ResourcesFilter:
    """Free capacity must hold the machine's cpus and memory."""

    name = "resources"

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        w = offer.worker
        short = shortfall(request.resources, w.capacity, w.allocated)
        return None if short is None else Rejection(short.reason, short.detail)


def utilisation_after(request: PlacementRequest, offer: Offer) -> tuple[float, float]:
    """(cpu, memory) utilisation of the worker if the machine were placed there."""
    w = offer.worker
    want = request.resources

    def ratio(used: int, cap: int) -> float:
        if cap <= 0:
            return 1.0 if used > 0 else 0.0
        return used / cap

    cpu = ratio(w.allocated.millicpus + want.millicpus, w.capacity.millicpus)
    mem = ratio(w.allocated.memory_mb + want.memory_mb, w.capacity.memory_mb)
    return cpu, mem


@dataclass(frozen=True)
class BestFitScorer:
    """Best fit by linear interpolation: the mean of a utility curve per resource, taken at the
    utilisation the worker would have after the placement."""

    cpu_curve: Curve = DEFAULT_CURVE
    memory_curve: Curve = DEFAULT_CURVE
    weight: float = 1.0
    name: str = "best-fit"

    def score(self, request: PlacementRequest, offer: Offer) -> float:
        cpu, mem = utilisation_after(request, offer)
        return (self.cpu_curve.value(cpu) + self.memory_curve.value(mem)) / 2
