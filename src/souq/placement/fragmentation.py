"""GPU fragmentation, as FGD measures it (Weng et al., "Beware of Fragmentation", USENIX ATC '23).

A worker is its free CPU (millicores) and the free thousandths of each of its GPUs. The target
workload M is the shapes of machines expected to come (:class:`Shape`, each with its share
``p`` of them). For one shape ``m``:

- if ``m`` fits the worker (CPU, enough GPUs with room for its per-GPU request, the model), the
  worker's fragmentation for it, F(m), is the free thousandths of the GPUs too empty for it
  (those with less free than ``m`` asks of one GPU);
- otherwise (and always for a CPU-only ``m``) it is all the worker's free GPU thousandths.

F(M) = Σ p_m · F(m). A placement is scored by how much it lowers F(M), squashed to an integer
0-100: ⌊100 · sigmoid(ΔF / 1000)⌋. The integer keeps FGD's ties, and ties go to the first
worker in the pipeline's order (docs/placement.md says why that matters).

Souq adds what F(M) misses: **stranded GPU**, the free GPU a worker's free CPU can no longer
feed at the workload's own ratio of CPU to GPU (:func:`stranded`). F(M) looks at one expected
shape at a time, so it does not see a worker spending its CPU faster than its GPUs (a worker of
96 cores and 8 GPUs against a mix of 11 cores a GPU) until the GPUs are past saving.

Pure; the simulator evaluates the same definitions over arrays (:mod:`souq.sim.frag`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from souq.model.resources import GPU_MILLI

__all__ = [
    "DEFAULT_WORKLOAD",
    "Shape",
    "cpu_per_gpu",
    "node_frag",
    "squash",
    "stranded",
    "task_frag",
]


@dataclass(frozen=True, slots=True)
class Shape:
    """A kind of machine as the target workload keys it (memory is not part of the key), and
    its share ``p`` of the workload. ``gpu_milli`` is per GPU: 1000 for whole GPUs."""

    cpu_milli: int
    gpu_milli: int
    num_gpu: int
    model: str = ""
    p: float = 0.0


# What a broker assumes is coming when it is told nothing: whole GPUs, one to eight, and shares
# of a half and a quarter of one, with a little CPU each. An operator with a known mix says so
# (PlacementDefaults.workload); the simulator takes the trace's own.
DEFAULT_WORKLOAD: tuple[Shape, ...] = (
    Shape(4000, GPU_MILLI, 1, p=0.4),
    Shape(8000, GPU_MILLI, 2, p=0.1),
    Shape(16000, GPU_MILLI, 4, p=0.05),
    Shape(32000, GPU_MILLI, 8, p=0.05),
    Shape(2000, 500, 1, p=0.2),
    Shape(1000, 250, 1, p=0.2),
)


def task_frag(cpu_free: int, gpu_free: Sequence[int], task: Shape, model: str = "") -> int:
    """F(m): the worker's free GPU thousandths that shape ``task`` cannot use."""
    total = sum(gpu_free)
    if task.num_gpu == 0 or cpu_free < task.cpu_milli:
        return total
    if task.model and model not in task.model.split("|"):
        return total
    if sum(1 for f in gpu_free if f >= task.gpu_milli) < task.num_gpu:
        return total
    return sum(f for f in gpu_free if f < task.gpu_milli)


def node_frag(
    cpu_free: int, gpu_free: Sequence[int], workload: Sequence[Shape], model: str = ""
) -> float:
    """F(M) = Σ_m p_m · F(m)."""
    return sum(t.p * task_frag(cpu_free, gpu_free, t, model) for t in workload)


def cpu_per_gpu(workload: Sequence[Shape]) -> float:
    """The workload's millicores per GPU thousandth: Σ p·cpu / Σ p·GPU thousandths over its GPU
    shapes (0 when it has none)."""
    gpu_shapes = [t for t in workload if t.num_gpu > 0]
    gpu = sum(t.p * t.num_gpu * t.gpu_milli for t in gpu_shapes)
    return sum(t.p * t.cpu_milli for t in gpu_shapes) / gpu if gpu > 0 else 0.0


def stranded(cpu_free: int, gpu_free_total: int, ratio: float) -> float:
    """The free GPU thousandths the worker's free CPU cannot feed at ``ratio`` millicores per
    thousandth (the workload's, :func:`cpu_per_gpu`): GPU that machines like the expected ones
    could not use for want of CPU. 0 when ``ratio`` is 0."""
    if ratio <= 0:
        return 0.0
    return max(0.0, gpu_free_total - cpu_free / ratio)


def squash(delta: float) -> int:
    """A fragmentation decrease as FGD's integer score: ⌊100 · sigmoid(Δ / 1000)⌋."""
    return int(100.0 / (1.0 + math.exp(min(-delta / 1000, 700.0))))
