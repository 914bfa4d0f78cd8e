"""GPU fragmentation as FGD measures it (Weng et al., USENIX ATC '23), restated from
the paper, as docs/simulator.md restates it.

A node is its free CPU (millicores) and the free milli of each of its GPUs. For one kind of task
``m`` of the target workload M:

- if ``m`` fits the node (CPU, enough GPUs with room for its per-GPU request, the model), its
  fragmentation F_n(m) is the free milli of the GPUs too empty-handed for it: those with less
  free than ``m``'s per-GPU request;
- otherwise (and always for a CPU-only ``m``) it is all the node's free GPU milli.

The node's fragmentation is F_n(M) = Σ p_m · F_n(m); FGD's score of a placement is how much it
lowers that, squashed to an integer in [0, 100]: ⌊100 · sigmoid(ΔF / 1000)⌋.

Two forms: plain functions over one node (the definition, for reading and tests) and numpy
forms over many nodes at once (what the replay runs).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from souq.placement.fragmentation import node_frag, squash, task_frag
from souq.sim.arrays import Floats, Ints
from souq.sim.traces import MILLI
from souq.sim.workload import PodSpec

__all__ = [
    "Workload",
    "fgd_score",
    "node_frag",
    "squash",
    "squash_all",
    "task_frag",
]


def fgd_score(
    cpu_free: int,
    gpu_free: Sequence[int],
    *,
    cpu: int,
    num_gpu: int,
    gpu_milli: int,
    workload: Sequence[PodSpec],
) -> tuple[int, tuple[int, ...]] | None:
    """FGD's score of placing a pod on the node, and the GPUs it would take; ``None`` when the
    pod does not fit the node's GPUs.

    A sharing pod is tried on every GPU with room and keeps the first best; a whole-GPU pod
    takes the lowest-numbered free GPUs; a CPU-only pod takes none (its CPU may still stop
    typical GPU tasks from fitting)."""
    before = node_frag(cpu_free, gpu_free, workload)
    after_cpu = cpu_free - cpu
    if num_gpu == 1 and gpu_milli < MILLI:
        best: tuple[int, tuple[int, ...]] | None = None
        for i, f in enumerate(gpu_free):
            if f < gpu_milli:
                continue
            after = list(gpu_free)
            after[i] -= gpu_milli
            score = squash(before - node_frag(after_cpu, after, workload))
            if best is None or score > best[0]:
                best = (score, (i,))
        return best
    taken = tuple(i for i, f in enumerate(gpu_free) if f == MILLI)[:num_gpu]
    if len(taken) < num_gpu:
        return None
    after = [0 if i in taken else f for i, f in enumerate(gpu_free)]
    return squash(before - node_frag(after_cpu, after, workload)), taken


class Workload:
    """The target workload as arrays, to measure many nodes at once.

    ``gpus`` is an (n, G) array of free milli per GPU (a node with fewer GPUs pads with 0, which
    no task can use and which adds nothing), ``cpus`` an (n,) array of free millicores."""

    def __init__(self, specs: Sequence[PodSpec]) -> None:
        self.specs = tuple(specs)
        self.cpu = np.array([s.cpu_milli for s in specs], dtype=np.int64)
        self.req = np.array([s.gpu_milli for s in specs], dtype=np.int64)
        self.k = np.array([s.num_gpu for s in specs], dtype=np.int64)
        self.p = np.array([s.p for s in specs], dtype=np.float64)
        self.gpu_task = self.k > 0

    def frag(self, cpus: Ints, gpus: Ints) -> Floats:
        """F_n(M) of each node, shape (n,)."""
        room = gpus[..., None] >= self.req  # (..., G, M)
        count = room.sum(axis=-2)
        below = np.where(room, 0, gpus[..., None]).sum(axis=-2)
        total = gpus.sum(axis=-1)
        fits = (count >= self.k) & (cpus[..., None] >= self.cpu) & self.gpu_task
        per_task = np.where(fits, below, total[..., None])
        return np.asarray(per_task @ self.p, dtype=np.float64)

    def frag_after_share(self, cpus: Ints, gpus: Ints, cpu: int, milli: int) -> Floats:
        """F_n(M) after a sharing pod (``cpu``, ``milli`` on one GPU) lands on GPU j, for every
        node and every j: shape (n, G). Entries of GPUs without room are meaningless."""
        room = gpus[..., None] >= self.req  # (n, G, M)
        count = room.sum(axis=1)  # (n, M)
        below = np.where(room, 0, gpus[..., None]).sum(axis=1)  # (n, M)
        total = gpus.sum(axis=1)  # (n,)
        left = gpus - milli  # (n, G): GPU j after the pod
        room_after = left[..., None] >= self.req  # (n, G, M)
        count_j = count[:, None, :] - room + room_after
        below_j = (
            below[:, None, :]
            - np.where(room, 0, gpus[..., None])
            + np.where(room_after, 0, left[..., None])
        )
        cpu_ok = (cpus - cpu)[:, None] >= self.cpu  # (n, M)
        fits = (count_j >= self.k) & cpu_ok[:, None, :] & self.gpu_task
        per_task = np.where(fits, below_j, (total - milli)[:, None, None])
        return np.asarray(per_task @ self.p, dtype=np.float64)


def squash_all(delta: Floats) -> Ints:
    """:func:`squash` over an array."""
    x = np.clip(-delta / 1000, -700.0, 700.0)
    return np.asarray(100.0 / (1.0 + np.exp(x)), dtype=np.float64).astype(np.int64)
