"""The interfaces of the pipeline's stages and the one fit rule.

* A **filter** accepts an offer (``None``) or rejects it with a :class:`Rejection`: a stable
  ``reason`` code, human ``detail``, and, when the request itself asked for what was not met, the
  ``unmet`` item (a constraint's text) so that a refusal can name it.
* A **scorer** returns one bounded score in [0, 1] under its ``name``, or ``None`` when it has no
  opinion on this request (cache locality without an image); the pipeline then leaves it out
  of that offer's mean.

:func:`shortfall` is the one fit rule: the broker's filter, a worker's offers (advisory) and its
claims (binding) all use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from souq.model.protocol import Offer
from souq.model.reasons import Reason
from souq.model.resources import Resources
from souq.placement.gpus import free_of, gpu_misfit
from souq.placement.request import PlacementRequest

__all__ = [
    "Filter",
    "Rejection",
    "Scorer",
    "Shortfall",
    "shortfall",
    "utilisation_after",
]


@dataclass(frozen=True)
class Rejection:
    reason: str  # a stable code: a souq.model.reasons.Reason (or what a worker's offer said)
    detail: str  # human words about this worker
    unmet: str | None = None  # what the request asked that this worker lacks, e.g. "label.a = b"


class Filter(Protocol):
    @property
    def name(self) -> str: ...

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None: ...


class Scorer(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def weight(self) -> float: ...

    def score(self, request: PlacementRequest, offer: Offer) -> float | None: ...


@dataclass(frozen=True)
class Shortfall:
    reason: Reason  # INSUFFICIENT_CPU, _MEMORY, _DISK, _GPUS, _GPU_SHARE, or WRONG_GPU_MODEL
    detail: str  # human words


# What a machine can be short of, in the order checked: the reason, the amount compared (cpu in
# millicores, so that sums are exact) and how the shortfall reads, as "needs {...} free" with w:
# what the machine wants, c: the worker's capacity, free: what is left of it (cores: in cores).
# GPUs come last, GPU by GPU (:mod:`souq.placement.gpus`).
_FITS: tuple[tuple[Reason, str, str], ...] = (
    (Reason.INSUFFICIENT_CPU, "millicpus", "{w.cpus:g} cpus; {cores:g} of {c.cpus:g}"),
    (Reason.INSUFFICIENT_MEMORY, "memory_mb", "{w.memory_mb} MiB; {free} of {c.memory_mb} MiB"),
    (Reason.INSUFFICIENT_DISK, "disk_mb", "{w.disk_mb} MiB of disk; {free} of {c.disk_mb} MiB"),
)


def shortfall(
    want: Resources,
    capacity: Resources,
    allocated: Resources,
    gpu_free: Sequence[int] = (),
    *,
    count: int = 1,
) -> Shortfall | None:
    """None when ``count`` machines of ``want`` fit in what ``capacity`` leaves after
    ``allocated`` (and, GPU by GPU, in ``gpu_free``: the free thousandths of each GPU, estimated
    from the sums when not given); else why not (the first resource short, in the order cpu,
    memory, disk, gpus)."""
    total = want if count == 1 else want.times(count)
    for reason, amount, reads in _FITS:
        free: int = getattr(capacity, amount) - getattr(allocated, amount)
        if getattr(total, amount) > free:
            free = max(free, 0)
            amounts = reads.format(w=total, c=capacity, free=free, cores=free / 1000)
            return Shortfall(reason, f"needs {amounts} free")
    if not want.wants_gpu:
        return None
    misfit = gpu_misfit(want, capacity, free_of(capacity, allocated, gpu_free), count)
    return None if misfit is None else Shortfall(*misfit)


def _ratio(used: int, cap: int) -> float:
    if cap <= 0:
        return 1.0 if used > 0 else 0.0
    return min(max(used / cap, 0.0), 1.0)


def utilisation_after(request: PlacementRequest, offer: Offer) -> tuple[float, float]:
    """(cpu, memory) utilisation of the worker if the machine were placed there, in [0, 1]."""
    w = offer.worker
    want = request.resources
    cpu = _ratio(w.allocated.millicpus + want.millicpus, w.capacity.millicpus)
    mem = _ratio(w.allocated.memory_mb + want.memory_mb, w.capacity.memory_mb)
    return cpu, mem
