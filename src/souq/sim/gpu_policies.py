"""The six node scores of the ATC'23 experiment (Weng et al., USENIX ATC '23), over arrays of
candidate nodes, and how each picks the GPUs inside the node it chose.

Restated from the paper's baselines and FGD (docs/simulator.md). Every score is an integer in
[0, 100], higher is better; ties go to the node first in the seeded node order, which the caller
realises by keeping its arrays in that order (``argmax`` takes the first best).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from souq.sim.arrays import Ints
from souq.sim.frag import Workload, squash_all
from souq.sim.traces import MILLI, Pod

__all__ = [
    "POLICIES",
    "Candidates",
    "Ints",
    "Policy",
    "best_gpus",
    "fgd",
    "pod_class",
    "score",
]

Policy = Literal["random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd"]
POLICIES: tuple[Policy, ...] = (
    "random",
    "dotprod",
    "gpuclustering",
    "gpupacking",
    "bestfit",
    "fgd",
)

MAX_CPU = 128_000  # the largest node's millicores: both fit scores divide by it
MAX_GPU = 8 * MILLI  # the largest node's GPU milli


@dataclass(frozen=True, slots=True)
class Candidates:
    """The feasible nodes as arrays: free millicores (n,), free milli per GPU (n, G), GPU count
    (n,) and the classes of GPU pods each hosts, as bits of :func:`pod_class` (n,)."""

    cpus: Ints
    gpus: Ints
    ngpu: Ints
    classes: Ints


def pod_class(pod: Pod) -> int:
    """GpuClustering's class of a GPU pod as one bit: share, 1, 2, 4 or 8 GPUs; 0 if none."""
    if pod.num_gpu == 0:
        return 0
    if pod.shares_gpu:
        return 1
    return 1 << min(pod.num_gpu.bit_length(), 4)


def _fully_free_taken(gpus: Ints, k: int) -> npt.NDArray[np.bool_]:
    """The lowest-numbered ``k`` fully free GPUs of each node."""
    full = gpus == MILLI
    taken: npt.NDArray[np.bool_] = full & (np.cumsum(full, axis=1) <= k)
    return taken


def fgd(c: Candidates, pod: Pod, wl: Workload) -> tuple[Ints, Ints]:
    """FGD's scores and, for a sharing pod, each node's chosen GPU (else -1)."""
    before = wl.frag(c.cpus, c.gpus)
    if pod.shares_gpu:
        after = wl.frag_after_share(c.cpus, c.gpus, pod.cpu_milli, pod.gpu_milli)
        per_gpu = squash_all(before[:, None] - after)
        per_gpu[c.gpus < pod.gpu_milli] = -1
        return per_gpu.max(axis=1), per_gpu.argmax(axis=1)
    gpus = c.gpus
    if pod.num_gpu:
        gpus = np.where(_fully_free_taken(c.gpus, pod.num_gpu), 0, c.gpus)
    after_all = wl.frag(c.cpus - pod.cpu_milli, gpus)
    return squash_all(before - after_all), np.full(len(c.cpus), -1, dtype=np.int64)


def _dotprod(c: Candidates, pod: Pod) -> Ints:
    free_gpu = c.gpus.sum(axis=1)
    dot = (c.cpus / MAX_CPU) * (pod.cpu_milli / MAX_CPU) + (free_gpu / MAX_GPU) * (
        pod.gpu_request_milli / MAX_GPU
    )
    out: Ints = np.floor(100 * (1 - dot / 2)).astype(np.int64)
    return out


def _bestfit(c: Candidates, pod: Pod) -> Ints:
    # Min-max normalisation across the candidates keeps the order and the set of best nodes,
    # so the raw score decides alone.
    free_gpu = c.gpus.sum(axis=1)
    left = (c.cpus - pod.cpu_milli) / MAX_CPU * 0.5 + (
        free_gpu - pod.gpu_request_milli
    ) / MAX_GPU * 0.5
    out: Ints = ((1.0 - left) * 100).astype(np.int64)
    return out


def _gpuclustering(c: Candidates, pod: Pod) -> Ints:
    mine = pod_class(pod)
    if not mine:
        return np.zeros(len(c.cpus), dtype=np.int64)
    same = (c.classes & mine) != 0
    others = (c.classes & ~mine) != 0
    base = np.where(same & ~others, 75, np.where(same, 50, np.where(others, 0, 25))).astype(
        np.int64
    )
    out: Ints = base + 25 * (MAX_GPU - c.gpus.sum(axis=1)) // MAX_GPU
    return out


def _gpupacking(c: Candidates, pod: Pod) -> Ints:
    if not pod.num_gpu:
        return np.zeros(len(c.cpus), dtype=np.int64)
    nfull = (c.gpus == MILLI).sum(axis=1)
    idle = np.maximum(33 - nfull, nfull)
    if pod.shares_gpu:
        # The tightest GPU with room: a used one scores by how little it has left.
        masked = np.where(c.gpus >= pod.gpu_milli, c.gpus, MILLI + 1)
        tight = masked.min(axis=1)
        used = np.where(tight == MILLI, 49, np.maximum(100 - (tight * 100 // MILLI) // 10, 50))
    else:
        used = np.full(len(c.cpus), max(50 - pod.num_gpu, 33), dtype=np.int64)
    return np.where(nfull == c.ngpu, idle, used).astype(np.int64)


def score(
    policy: Policy, c: Candidates, pod: Pod, wl: Workload | None = None
) -> tuple[Ints, Ints | None]:
    """The policy's integer scores of the candidates, and FGD's GPU choice per node (else
    ``None``: the policy's GPU selection picks after the node is chosen)."""
    if policy == "fgd":
        assert wl is not None, "FGD measures fragmentation against a target workload"
        return fgd(c, pod, wl)
    if policy == "dotprod":
        return _dotprod(c, pod), None
    if policy == "bestfit":
        return _bestfit(c, pod), None
    if policy == "gpuclustering":
        return _gpuclustering(c, pod), None
    if policy == "gpupacking":
        return _gpupacking(c, pod), None
    return np.zeros(len(c.cpus), dtype=np.int64), None


def best_gpus(free: list[int], pod: Pod, rng: random.Random | None = None) -> tuple[int, ...]:
    """The GPUs a pod takes on a node: a sharing pod the GPU with the least room that still
    fits (lowest number on ties; a uniformly random fitting one when ``rng`` is given);
    whole-GPU pods the lowest-numbered fully free GPUs."""
    if not pod.num_gpu:
        return ()
    if pod.shares_gpu:
        fitting = [i for i, f in enumerate(free) if f >= pod.gpu_milli]
        if rng is not None:
            return (fitting[rng.randrange(len(fitting))],)
        return (min(fitting, key=lambda i: (free[i], i)),)
    return tuple(i for i, f in enumerate(free) if f == MILLI)[: pod.num_gpu]
