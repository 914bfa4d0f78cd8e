"""The GPU parts of the column form (:mod:`souq.sim.columns`) that need only arrays: the
fragmentation measure F(M) and stranded GPUs, a worker's own GPU choice, and the GPU-packing and
GPU-clustering points, each for every row at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from souq.model.resources import GPU_MILLI, Resources
from souq.placement import gpu_scorers, gpus
from souq.placement.fragmentation import Shape
from souq.sim.arrays import Floats, Ints

__all__ = ["SHAPE_BITS", "frag", "gpuclustering", "gpupacking", "picked", "points", "stranded"]


# A worker's GPU shapes as bits of one integer column (a share of one GPU, 1, 2, 4, 8; other: 32).
SHAPE_BITS = {"share": 1, "1": 2, "2": 4, "4": 8, "8": 16}


def frag(workload: Sequence[Shape], cpus: Ints, gpus: Ints, models: npt.NDArray[Any]) -> Floats:
    """F(M) of each row (:mod:`souq.placement.fragmentation`) over arrays."""
    req = np.array([s.gpu_milli for s in workload], dtype=np.int64)
    k = np.array([s.num_gpu for s in workload], dtype=np.int64)
    cpu = np.array([s.cpu_milli for s in workload], dtype=np.int64)
    p = np.array([s.p for s in workload], dtype=np.float64)
    room = gpus[:, :, None] >= req  # (n, G, M)
    count = room.sum(axis=1)
    below = np.where(room, 0, gpus[:, :, None]).sum(axis=1)
    total = gpus.sum(axis=1)
    fits = (count >= k) & (cpus[:, None] >= cpu) & (k > 0)
    for j, s in enumerate(workload):
        if s.model:
            fits[:, j] &= np.isin(models, s.model.split("|"))
    per_task = np.where(fits, below, total[:, None])
    return np.asarray(per_task @ p, dtype=np.float64)


def stranded(cpus: Ints, gpu_total: Ints, ratio: float) -> Floats:
    """:func:`souq.placement.fragmentation.stranded` over arrays."""
    return np.maximum(0.0, gpu_total - cpus / ratio)


def picked(want: Resources, free: Ints) -> Ints:
    """``free`` after the worker's own GPU choice (:func:`souq.placement.gpus.pick`)."""
    out = free.copy()
    rows = np.arange(len(free))
    if want.gpus > 0:
        idle = free >= GPU_MILLI
        out[idle & (np.cumsum(idle, axis=1) <= want.gpus)] = 0
    elif want.gpu_milli > 0:
        room = np.where(free >= want.gpu_milli, free, GPU_MILLI + 1)
        out[rows, room.argmin(axis=1)] -= want.gpu_milli
    return out


def gpupacking(want: Resources, free: Ints, ngpu: Ints) -> Floats:
    if not want.wants_gpu:
        return np.zeros(len(free))
    nfull = (free >= GPU_MILLI).sum(axis=1)
    idle = np.maximum(33 - nfull, nfull)
    if want.gpus == 0:
        tight = np.where(free >= want.gpu_milli, free, GPU_MILLI).min(axis=1)
        used = np.where(
            tight >= GPU_MILLI, 49, np.maximum(100 - (tight * 100 // GPU_MILLI) // 10, 50)
        )
    else:
        used = np.full(len(free), max(50 - want.gpus, 33))
    return points(np.where(nfull == ngpu, idle, used))


def gpuclustering(
    s: gpu_scorers.GpuClusteringScorer, want: Resources, free: Ints, shapes: Ints
) -> Floats:
    mine = SHAPE_BITS.get(gpus.gpu_shape(want), 0) if want.wants_gpu else 0
    if not mine:
        return np.zeros(len(free))
    same, others = (shapes & mine) != 0, (shapes & ~mine) != 0
    base = np.where(same & ~others, 75, np.where(same, 50, np.where(others, 0, 25)))
    return points(base + 25 * (s.max_gpu - free.sum(axis=1)) // s.max_gpu)


def points(scores: npt.NDArray[Any]) -> Floats:
    """Integer points 0-100 as the [0, 1] score they stand for."""
    return np.asarray(np.clip(scores, 0, 100) / 100, dtype=np.float64)
