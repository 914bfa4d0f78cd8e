"""The stages of the placement pipeline: filters reject with a named reason; scorers add one
bounded, named score in [0, 1]."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from souq.model.protocol import Offer
from souq.placement.curves import DEFAULT_CURVE, Curve
from souq.placement.request import PlacementRequest

__all__ = [
    "BestFitScorer",
    "EligibleFilter",
    "Filter",
    "Rejection",
    "ResourcesFilter",
    "Scorer",
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


class ResourcesFilter:
    """Free capacity must hold the machine's cpus and memory."""

    name = "resources"

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        w = offer.worker
        free = w.capacity.minus(w.allocated)
        want = request.resources
        if want.fits_within(free):
            return None
        if want.millicpus > free.millicpus:
            return Rejection("insufficient_cpu", f"needs {want.cpus:g} cpus, {free.cpus:g} free")
        return Rejection(
            "insufficient_memory", f"needs {want.memory_mb} MiB, {free.memory_mb} MiB free"
        )


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
