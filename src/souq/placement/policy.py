"""Wiring: from a placement policy (the request's, over the broker's defaults) to a pipeline.

:func:`build_pipeline` is the one place that says which stages run and in what order; the
comment on each stage says why it sits there. :class:`PipelineCache` keeps built pipelines by
policy, so a broker builds each distinct policy once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from souq.model.policy import FIT_SCORERS, GPU_POLICIES, PlacementDefaults, PlacementPolicy
from souq.placement import filters, gpu_scorers, scorers
from souq.placement.curves import DEFAULT_CURVE, Curve
from souq.placement.fragmentation import DEFAULT_WORKLOAD, Shape, cpu_per_gpu
from souq.placement.pipeline import Pipeline
from souq.placement.stages import Scorer

__all__ = [
    "DEFAULT_WEIGHTS",
    "PipelineCache",
    "build_pipeline",
    "default_pipeline",
    "weights_of",
    "workload_of",
]

# Weights of the scorers beside the fit scorer (which weighs 1). Anti-affinity at half keeps an
# app's machines apart when the fit scores are close (an empty worker against one at half load
# with a machine of the app: spread wins) but not at the price of a hot spot. Load nudges
# between otherwise equal workers: a busy host costs about a quarter of what the fit is worth.
# Cache locality weighs as much as the fit: pulling a large image is the costliest step of a
# start (a 64 MiB pull is hundreds of milliseconds against a few for the start), so it outweighs
# anti-affinity; the cache scorer scales its own range down for small images, and the filters
# (capacity first) stay hard. An app that must spread says so (`distinct_workers_for`).
DEFAULT_WEIGHTS: dict[str, float] = {"anti-affinity": 0.5, "load": 0.25, "cache": 1.0}


def weights_of(policy: PlacementPolicy) -> dict[str, float]:
    """Every scorer's weight under ``policy``: the chosen fit scorer 1, the other fit scorers 0,
    the rest :data:`DEFAULT_WEIGHTS`; then the policy's own ``weights`` on top."""
    base: dict[str, float] = {n: 1.0 if n == policy.policy else 0.0 for n in FIT_SCORERS}
    # Best-fit judges workers without GPUs; on GPU workers fragmentation does (the two never
    # both score one worker).
    base["fragmentation"] = 1.0 if policy.policy == "best-fit" else 0.0
    return {**base, **DEFAULT_WEIGHTS, **policy.weights}


def workload_of(defaults: PlacementDefaults) -> tuple[Shape, ...]:
    """The GPU workload the broker's defaults name, as shapes (the generic mix if none)."""
    if not defaults.gpu_workload:
        return DEFAULT_WORKLOAD
    total = sum(g.share for g in defaults.gpu_workload)
    return tuple(
        Shape(
            cpu_milli=round(g.cpus * 1000),
            gpu_milli=1000 if g.gpus else g.gpu_milli,
            num_gpu=g.gpus or (1 if g.gpu_milli else 0),
            model=g.gpu_model or "",
            p=g.share / total,
        )
        for g in defaults.gpu_workload
    )


def build_pipeline(
    policy: PlacementPolicy | None,
    defaults: PlacementDefaults,
    *,
    workload: Sequence[Shape] | None = None,
    largest: tuple[int, int] = (gpu_scorers.MAX_CPU, gpu_scorers.MAX_GPU),
) -> Pipeline:
    """The pipeline for ``policy`` laid over the broker's ``defaults`` (None: the defaults).
    GPU scorers measure fragmentation against ``workload`` (None: the defaults' ``gpu_workload``)
    and the paper's fit scores divide by the ``largest`` worker's (millicores, GPU
    thousandths)."""
    merged = defaults if policy is None else policy.over(defaults)
    if workload is None:
        workload = workload_of(defaults)
    w = weights_of(merged)
    curves = merged.curves
    cpu_curve = Curve.of(curves.cpu) if curves and curves.cpu else DEFAULT_CURVE
    mem_curve = Curve.of(curves.memory) if curves and curves.memory else DEFAULT_CURVE
    max_cpu, max_gpu = largest
    all_scorers: list[Scorer] = [
        # Fit: how full the worker would be after the placement. The policy's choice weighs 1;
        # another fit scorer runs only if a weight asks for it (e.g. best-fit with some spread).
        scorers.BestFitScorer(
            cpu_curve=cpu_curve,
            memory_curve=mem_curve,
            weight=w["best-fit"],
            skip_gpu_workers=w["fragmentation"] > 0,
        ),
        scorers.BinPackScorer(weight=w["binpack"]),
        scorers.SpreadScorer(weight=w["spread"]),
        # On GPU workers, fit is fragmentation: what the placement leaves for the machines to
        # come (docs/placement.md, "GPUs").
        gpu_scorers.FgdScorer(
            workload=tuple(workload),
            gpu_workers_only=True,
            cpu_per_gpu=cpu_per_gpu(workload),
            weight=w["fragmentation"],
            name="fragmentation",
        ),
        # The ATC'23 paper's policies, each alone under its name (for comparison and replay).
        gpu_scorers.FgdScorer(workload=tuple(workload), weight=w["fgd"]),
        gpu_scorers.LeftoverScorer(max_cpu=max_cpu, max_gpu=max_gpu, weight=w["leftover"]),
        gpu_scorers.DotProdScorer(max_cpu=max_cpu, max_gpu=max_gpu, weight=w["dotprod"]),
        gpu_scorers.GpuPackingScorer(weight=w["gpupacking"]),
        gpu_scorers.GpuClusteringScorer(max_gpu=max_gpu, weight=w["gpuclustering"]),
        # Keep an app's machines on different workers, so that one host lost is not the app lost.
        scorers.AntiAffinityScorer(weight=w["anti-affinity"]),
        # Reservations are promises, load is what the host really does: prefer the quieter one.
        scorers.LoadScorer(weight=w["load"]),
        # A worker holding the image starts the machine without pulling it first.
        scorers.CacheScorer(weight=w["cache"]),
    ]
    return Pipeline(
        name=merged.policy,
        filters=(
            # A worker that takes no new machines (cordoned, draining) is out before anything
            # else is asked of it.
            filters.StateFilter(),
            # Only the requested region; cheap, and guards against a stray offer.
            filters.RegionFilter(),
            # The machine's driver must exist there; nothing else matters if it cannot run.
            filters.DriverFilter(),
            # The user's constraints: before capacity, so that a refusal names the constraint
            # rather than a full worker the constraint would have excluded anyway.
            filters.ConstraintFilter(),
            # distinct_workers_for: app (a hard rule; the anti-affinity scorer is the soft one).
            filters.DistinctWorkersFilter(),
            # A standby away from the workers of the machines it stands by for.
            filters.StandbyFilter(),
            # A machine that mounts a volume runs where the volume is (and a volume with a
            # unique zone away from its siblings): a hard rule, before capacity, so that the
            # record says why the other workers were skipped.
            filters.VolumeFilter(),
            # GPUs GPU by GPU, and their model: before the worker's own verdict, so that a GPU
            # machine's refusal names the GPU (what it came for), not a cpu it lacks as well.
            filters.GpuFilter(),
            # The worker's own refusal (full, by its count, which includes its quotes' holds).
            filters.EligibleFilter(),
            # The broker re-checks free capacity: a lax or older worker cannot overcommit.
            filters.ResourcesFilter(),
        ),
        # Zero-weight scorers are off: not computed, not shown.
        scorers=tuple(s for s in all_scorers if s.weight > 0),
        # Then sample (seeded from the request id), weight and average the bounded scores, and
        # order best first, ties in the seeded order: see souq.placement.select.
        limit=defaults.limit,
        # GPU scores are whole hundredths and tie often: the first worker by id wins, so that
        # ties consolidate (the paper's scheduler takes the smallest node name). Under best-fit
        # too where GPU workers are candidates: spreading CPU-only machines over GPU workers
        # would use up the CPU their GPUs need. Elsewhere ties go to the seeded order.
        ties="first"
        if merged.policy in GPU_POLICIES
        else "gpu-first"
        if merged.policy == "best-fit"
        else "random",
    )


def default_pipeline() -> Pipeline:
    """The default chain: best-fit, anti-affinity, load and cache locality, every filter."""
    return build_pipeline(None, PlacementDefaults())


class PipelineCache:
    """Built pipelines by policy (the request's merged over ``defaults``), least recently used
    dropped beyond ``size``. No policy is the defaults' pipeline, built once."""

    def __init__(self, defaults: PlacementDefaults, *, size: int = 64) -> None:
        self.defaults = defaults
        self.default = build_pipeline(None, defaults)
        self._size = size
        self._built: OrderedDict[str, Pipeline] = OrderedDict()

    def get(self, policy: PlacementPolicy | None) -> Pipeline:
        if policy is None:
            return self.default
        key = policy.model_dump_json(exclude_unset=True)
        pipeline = self._built.get(key)
        if pipeline is None:
            pipeline = build_pipeline(policy, self.defaults)
            self._built[key] = pipeline
            if len(self._built) > self._size:
                self._built.popitem(last=False)
        else:
            self._built.move_to_end(key)
        return pipeline
