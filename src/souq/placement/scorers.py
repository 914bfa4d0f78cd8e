"""Scorers: each gives one bounded score in [0, 1] under its name, higher is better, or ``None``
when it has no opinion on the request (then the offer's mean leaves it out).

Fit scorers read the worker's utilisation *after* the placement (reservations, not load):

* ``best-fit`` — a piecewise-linear utility per resource (:mod:`souq.placement.curves`),
  averaged over cpu and memory: fill workers to a comfortable level, never into hot spots.
* ``binpack`` — Nomad's formula, ``20 - (10^free_cpu + 10^free_mem)`` over 18: the fuller the
  better, right up to 100 %.
* ``spread`` — worst fit, ``1 - utilisation``: the emptier the better.

The others read what the worker reports about itself:

* ``anti-affinity`` — ``1 / (1 + n)`` for ``n`` machines of the same app already on the worker.
* ``load`` — ``1 - measured utilisation`` (cpu and memory the host really uses), so placement
  sees real load, not only reservations; no opinion when the worker does not measure it.
* ``cache`` — how little of the machine's image the worker would pull: 1 when it holds every
  layer; less the more bytes it lacks, down to 0 for an image of :data:`FULL_PULL` or more that
  it lacks whole (a small image's pull costs little, so it sways placement little). No opinion
  when the machine runs no image.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from souq.model.protocol import Offer
from souq.placement.curves import DEFAULT_CURVE, Curve
from souq.placement.request import PlacementRequest
from souq.placement.stages import utilisation_after

__all__ = [
    "FULL_PULL",
    "NOMAD_MAX_FIT",
    "AntiAffinityScorer",
    "BestFitScorer",
    "BinPackScorer",
    "CacheScorer",
    "LoadScorer",
    "SpreadScorer",
    "nomad_binpack",
]

NOMAD_MAX_FIT = 18.0  # 20 - (10^0 + 10^0): both resources exactly full
# An image this large, pulled whole, costs the cache scorer its whole range: at 100 MB/s it
# delays the start by 0.67 s, a hundred times what a start costs otherwise.
FULL_PULL = 64 * 2**20


def nomad_binpack(cpu: float, memory: float) -> float:
    """Nomad's bin-pack fitness of a node at utilisations ``cpu`` and ``memory`` (after the
    placement), normalised from [0, 18] to [0, 1]."""
    free_cpu, free_mem = 1.0 - _unit(cpu), 1.0 - _unit(memory)
    fitness = 20.0 - (10.0**free_cpu + 10.0**free_mem)
    return _unit(fitness / NOMAD_MAX_FIT)


@dataclass(frozen=True)
class BestFitScorer:
    """Best fit by linear interpolation: the mean of a utility curve per resource, taken at the
    utilisation the worker would have after the placement."""

    cpu_curve: Curve = DEFAULT_CURVE
    memory_curve: Curve = DEFAULT_CURVE
    weight: float = 1.0
    skip_gpu_workers: bool = False  # no opinion on GPU workers (fragmentation judges them)
    name: str = "best-fit"

    def score(self, request: PlacementRequest, offer: Offer) -> float | None:
        if self.skip_gpu_workers and offer.worker.capacity.gpus > 0:
            return None
        cpu, mem = utilisation_after(request, offer)
        return (self.cpu_curve.value(cpu) + self.memory_curve.value(mem)) / 2


@dataclass(frozen=True)
class BinPackScorer:
    """Nomad's bin-pack formula: prefer the worker the placement leaves fullest."""

    weight: float = 1.0
    name: str = "binpack"

    def score(self, request: PlacementRequest, offer: Offer) -> float:
        return nomad_binpack(*utilisation_after(request, offer))


@dataclass(frozen=True)
class SpreadScorer:
    """Worst fit: prefer the worker the placement leaves emptiest."""

    weight: float = 1.0
    name: str = "spread"

    def score(self, request: PlacementRequest, offer: Offer) -> float:
        cpu, mem = utilisation_after(request, offer)
        return 1.0 - (cpu + mem) / 2


@dataclass(frozen=True)
class AntiAffinityScorer:
    """Fewer machines of the same app on the worker is better: ``1 / (1 + n)``."""

    weight: float = 1.0
    name: str = "anti-affinity"

    def score(self, request: PlacementRequest, offer: Offer) -> float:
        return 1.0 / (1 + max(offer.app_machines, 0))


@dataclass(frozen=True)
class LoadScorer:
    """A less busy host is better: ``1 - mean(cpu %, memory %) / 100`` as measured."""

    weight: float = 1.0
    name: str = "load"

    def score(self, request: PlacementRequest, offer: Offer) -> float | None:
        load = offer.load
        if load is None:
            return None
        busy = (_unit(load.cpu_percent / 100) + _unit(load.memory_percent / 100)) / 2
        return 1.0 - busy


@dataclass(frozen=True)
class CacheScorer:
    """A worker that holds the machine's image starts it without pulling it first."""

    weight: float = 1.0
    name: str = "cache"

    def score(self, request: PlacementRequest, offer: Offer) -> float | None:
        image = request.image
        if image is None or offer.image_bytes is None:
            return None
        size = image.size
        if size <= 0:
            return 1.0
        lacking = _unit(offer.image_bytes / size)
        return 1.0 - lacking * min(1.0, size / FULL_PULL)


def _unit(x: float) -> float:
    """``x`` clamped to [0, 1] (NaN counts as 0)."""
    return 0.0 if math.isnan(x) else min(max(x, 0.0), 1.0)
