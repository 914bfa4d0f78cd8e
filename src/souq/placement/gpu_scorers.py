"""GPU-aware scorers: Souq's fragmentation scorer and the ATC'23 paper's baselines.

Each is a pipeline stage like the fit scorers: a bounded score in [0, 1] (an integer 0-100 over
100, as the paper's are, so that ties keep their meaning), or ``None`` when it has no opinion.
They read the worker's free CPU (millicores), the free thousandths of each GPU
(:func:`souq.placement.gpus.free_on`) and, for GpuClustering, the shapes of the GPU machines it
holds (``WorkerInfo.gpu_shapes``).

* ``fragmentation`` — Souq's default for GPU workers: FGD's score (how much the placement lowers
  the worker's fragmentation against the target workload, :mod:`souq.placement.fragmentation`)
  with stranded GPU counted as fragmented, taken at the GPUs the worker will really give
  (:func:`souq.placement.gpus.pick`). No opinion on a worker without GPUs (best-fit judges
  those).
* ``fgd`` — the paper's FGD on every worker.
* ``leftover`` — the paper's BestFit: the least CPU and GPU left after the placement, each over
  the largest worker's.
* ``dotprod`` — the paper's DotProd: the smallest dot product of the worker's free (CPU, GPU)
  and the machine's request.
* ``gpupacking`` — fill shared GPUs first (tightest first), then free GPUs of used workers, then
  idle workers, smallest first.
* ``gpuclustering`` — keep machines of one GPU shape together.

``random`` is no scorer at all: every feasible worker ties, and the pipeline's seeded order
picks one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from souq.model.protocol import Offer
from souq.model.resources import GPU_MILLI, Resources
from souq.placement import gpus
from souq.placement.fragmentation import DEFAULT_WORKLOAD, Shape, node_frag, squash, stranded
from souq.placement.gpus import gpu_shape
from souq.placement.request import PlacementRequest

__all__ = [
    "MAX_CPU",
    "MAX_GPU",
    "DotProdScorer",
    "FgdScorer",
    "GpuClusteringScorer",
    "GpuPackingScorer",
    "LeftoverScorer",
]

MAX_CPU = 128_000  # the largest worker's millicores the paper's scores divide by
MAX_GPU = 8 * GPU_MILLI  # its GPU thousandths


def _free(offer: Offer) -> tuple[int, tuple[int, ...]]:
    w = offer.worker
    return w.capacity.millicpus - w.allocated.millicpus, gpus.free_on(w)


def _asked(want: Resources) -> int:
    """The request's GPU thousandths in all."""
    return want.gpus * GPU_MILLI + want.gpu_milli


@dataclass(frozen=True)
class FgdScorer:
    """FGD: how much placing the machine here lowers the worker's fragmentation against the
    target ``workload``. ``gpu_workers_only`` (Souq's default) has no opinion on workers
    without GPUs."""

    workload: Sequence[Shape] = DEFAULT_WORKLOAD
    gpu_workers_only: bool = False
    # Count stranded GPU as fragmented, at this many millicores per GPU thousandth (Souq's
    # fragmentation: the workload's :func:`cpu_per_gpu`); 0: FGD as published.
    cpu_per_gpu: float = 0.0
    weight: float = 1.0
    name: str = "fgd"

    def score(self, request: PlacementRequest, offer: Offer) -> float | None:
        capacity = offer.worker.capacity
        if capacity.gpus == 0:
            return None if self.gpu_workers_only else 0.0
        want = request.resources
        cpu, free = _free(offer)
        got = gpus.pick(want, free)
        if got is None:
            return 0.0
        model = capacity.gpu_model or ""
        left = gpus.take(want, free, got)
        before = node_frag(cpu, free, self.workload, model)
        after = node_frag(cpu - want.millicpus, left, self.workload, model)
        if self.cpu_per_gpu > 0:
            before += stranded(cpu, sum(free), self.cpu_per_gpu)
            after += stranded(cpu - want.millicpus, sum(left), self.cpu_per_gpu)
        return squash(before - after) / 100


@dataclass(frozen=True)
class _OverLargestWorker:
    """The scale of the paper's scores that divide by the largest worker's capacity."""

    max_cpu: int = MAX_CPU
    max_gpu: int = MAX_GPU


@dataclass(frozen=True)
class LeftoverScorer(_OverLargestWorker):
    """The paper's BestFit: ``1 - (½ CPU left / max CPU + ½ GPU left / max GPU)``, floored to
    hundredths."""

    weight: float = 1.0
    name: str = "leftover"

    def score(self, request: PlacementRequest, offer: Offer) -> float:
        want = request.resources
        cpu, free = _free(offer)
        left = (
            0.5 * (cpu - want.millicpus) / self.max_cpu
            + 0.5 * (sum(free) - _asked(want)) / self.max_gpu
        )
        return _hundredths(int((1.0 - left) * 100))


@dataclass(frozen=True)
class DotProdScorer(_OverLargestWorker):
    """The paper's DotProd: ``1 - (free · asked) / 2`` over (CPU, GPU), each over the largest
    worker's: the worker with the least free of what the machine asks for."""

    weight: float = 1.0
    name: str = "dotprod"

    def score(self, request: PlacementRequest, offer: Offer) -> float:
        want = request.resources
        cpu, free = _free(offer)
        dot = (cpu / self.max_cpu) * (want.millicpus / self.max_cpu) + (
            sum(free) / self.max_gpu
        ) * (_asked(want) / self.max_gpu)
        return _hundredths(int(100 * (1 - dot / 2) // 1))


@dataclass(frozen=True)
class GpuPackingScorer:
    """The paper's GpuPacking: a share on the tightest shared GPU, then whole GPUs of a worker
    already in use, then an idle worker, the smallest first. CPU-only machines all tie."""

    weight: float = 1.0
    name: str = "gpupacking"

    def score(self, request: PlacementRequest, offer: Offer) -> float:
        want = request.resources
        if not want.wants_gpu:
            return 0.0
        _, free = _free(offer)
        n = len(free)
        full = sum(1 for f in free if f >= GPU_MILLI)
        if full == n:
            return _hundredths(max(33 - full, full))
        if want.gpus == 0:
            room = [f for f in free if f >= want.gpu_milli]
            tight = min(room) if room else GPU_MILLI
            if tight >= GPU_MILLI:
                return 0.49
            return _hundredths(max(100 - (tight * 100 // GPU_MILLI) // 10, 50))
        return _hundredths(max(50 - want.gpus, 33))


@dataclass(frozen=True)
class GpuClusteringScorer:
    """The paper's GpuClustering: a worker holding only machines of this GPU shape scores 75,
    this shape among others 50, none 25, only others 0; plus up to 25 the fuller its GPUs
    (over the largest worker's). CPU-only machines all tie."""

    max_gpu: int = MAX_GPU
    weight: float = 1.0
    name: str = "gpuclustering"

    def score(self, request: PlacementRequest, offer: Offer) -> float:
        mine = gpu_shape(request.resources)
        if not mine:
            return 0.0
        held = {shape for shape, n in offer.worker.gpu_shapes.items() if n > 0}
        same, others = mine in held, bool(held - {mine})
        base = 75 if same and not others else 50 if same else 0 if others else 25
        _, free = _free(offer)
        return _hundredths(base + 25 * (self.max_gpu - sum(free)) // self.max_gpu)


def _hundredths(points: int) -> float:
    return min(max(points, 0), 100) / 100
