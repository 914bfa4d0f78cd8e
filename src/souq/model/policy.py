"""How to rank offers: the ``placement`` part of a create body, and the broker's defaults.

``policy`` picks the fit scorer (``best-fit``, ``binpack`` or ``spread``); ``weights`` sets the
weight (0-10) of any scorer by name, 0 turning it off; ``curves`` reshapes best-fit's utility per
resource. What each scorer does and the default weights are in docs/placement.md; the pipeline
that these select is built by :func:`souq.placement.build_pipeline`.
"""

from __future__ import annotations

from itertools import pairwise
from typing import get_args

from pydantic import Field, field_validator, model_validator

from souq.model.base import Input
from souq.model.choices import FitPolicy

__all__ = [
    "FIT_SCORERS",
    "GPU_POLICIES",
    "SCORERS",
    "Curves",
    "GpuShape",
    "PlacementDefaults",
    "PlacementPolicy",
    "check_curve_points",
]

# The fit scorers a policy chooses among ("random" is none of them: every feasible worker ties).
FIT_SCORERS: tuple[str, ...] = tuple(p for p in get_args(FitPolicy) if p != "random")
# GPU policies: their scores are whole hundredths, and ties go to the first worker by id.
GPU_POLICIES: tuple[str, ...] = ("fgd", "leftover", "dotprod", "gpupacking", "gpuclustering")
SCORERS = (*FIT_SCORERS, "fragmentation", "anti-affinity", "load", "cache")
MAX_WEIGHT = 10.0


def check_curve_points(points: list[list[float]] | tuple[tuple[float, float], ...]) -> str | None:
    """Why ``points`` is not a utility curve, or None: at least two ``[x, y]`` pairs, x strictly
    increasing, both in [0, 1]. The one rule, shared by the model and :class:`Curve`."""
    if len(points) < 2:
        return "a curve needs at least two [x, y] points"
    if any(len(p) != 2 for p in points):
        return "each curve point is a pair [x, y]"
    xs = [p[0] for p in points]
    if any(b <= a for a, b in pairwise(xs)):
        return "curve points must have strictly increasing x"
    if any(not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0) for x, y in points):
        return "curve points must lie in [0, 1] x [0, 1]"
    return None


class Curves(Input):
    """Best-fit's utility curves per resource: ``[[utilisation, utility], ...]``."""

    cpu: list[list[float]] | None = Field(default=None, description="e.g. [[0, 0.4], [0.75, 1]]")
    memory: list[list[float]] | None = None

    @field_validator("cpu", "memory")
    @classmethod
    def _points(cls, v: list[list[float]] | None) -> list[list[float]] | None:
        if v is not None and (problem := check_curve_points(v)) is not None:
            raise ValueError(problem)
        return v


class PlacementPolicy(Input):
    """``placement`` in a create body; every field is optional and falls back to the broker's."""

    policy: FitPolicy = Field(
        default="best-fit",
        description="the fit scorer: best-fit (default: best fit by curves for cpu and memory, "
        "least fragmentation on GPU workers), binpack (Nomad's formula), spread; the ATC'23 "
        "GPU policies fgd, leftover (its BestFit), dotprod, gpupacking, gpuclustering; or "
        "random",
    )
    weights: dict[str, float] = Field(
        default_factory=dict,
        description="weight per scorer name, 0-10 (0 turns it off): " + ", ".join(SCORERS),
    )
    curves: Curves | None = Field(default=None, description="best-fit's curves per resource")

    @field_validator("weights")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        for name, weight in v.items():
            if name not in SCORERS:
                raise ValueError(f"unknown scorer {name!r}; known scorers: {', '.join(SCORERS)}")
            if not 0.0 <= weight <= MAX_WEIGHT:
                raise ValueError(f"weight of {name} must be between 0 and {MAX_WEIGHT:g}")
        return v

    def over(self, base: PlacementPolicy) -> PlacementPolicy:
        """This policy with ``base`` filling in what it does not set: ``policy`` when not given,
        weights key by key, curves resource by resource."""
        given = self.model_fields_set
        curves = base.curves
        if self.curves is not None:
            mine = self.curves.model_dump(exclude_none=True)
            curves = Curves(**{**(curves.model_dump() if curves else {}), **mine})
        return PlacementPolicy(
            policy=self.policy if "policy" in given else base.policy,
            weights={**base.weights, **self.weights},
            curves=curves,
        )


class GpuShape(Input):
    """A kind of machine the GPU workers are expected to take, and its share of them."""

    cpus: float = Field(ge=0, le=1024)
    gpus: int = Field(default=0, ge=0, le=64, description="whole GPUs")
    gpu_milli: int = Field(
        default=0, ge=0, le=1000, description="a share of one GPU, in thousandths"
    )
    gpu_model: str | None = None
    share: float = Field(gt=0, le=1, description="its part of the machines expected")

    @model_validator(mode="after")
    def _one_kind(self) -> GpuShape:
        if self.gpus and self.gpu_milli:
            raise ValueError("a shape asks whole gpus or a gpu_milli share, not both")
        return self


class PlacementDefaults(PlacementPolicy):
    """The broker's default policy (``BrokerConfig.placement``), plus what only an operator
    sets."""

    limit: int | None = Field(
        default=None,
        ge=1,
        description="score at most this many feasible offers, sampled with a seed from the "
        "request id (2 gives power-of-two-choices); none scores them all",
    )
    gpu_workload: list[GpuShape] | None = Field(
        default=None,
        max_length=256,
        description="the GPU machines expected to come, each with its share: what the "
        "fragmentation scorer measures a GPU worker against; none: a generic mix "
        "(docs/placement.md, GPUs)",
    )
