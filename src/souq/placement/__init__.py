"""Placement: a pure pipeline of filters, scorers and selectors. Imports nothing that does I/O.

``build_pipeline(policy, defaults)`` wires the chain (:mod:`souq.placement.policy`);
``Pipeline.rank(request, offers)`` runs it and returns a :class:`Ranking` that explains itself.
docs/placement.md tells the stages, the defaults and how to tune them.

Compiled with mypyc where a C compiler is at hand (:mod:`souq.compiled`).
"""

from souq.compiled import refuse_stale

refuse_stale()

# ruff: noqa: E402 - the check above must come before the compiled modules are imported
from souq.placement.constraints import attribute_of, unmet
from souq.placement.curves import DEFAULT_CURVE, Curve
from souq.placement.filters import (
    ConstraintFilter,
    DistinctWorkersFilter,
    DriverFilter,
    EligibleFilter,
    GpuFilter,
    RegionFilter,
    ResourcesFilter,
    StandbyFilter,
    StateFilter,
)
from souq.placement.pipeline import NOT_SAMPLED, Pipeline, Ranking
from souq.placement.policy import (
    DEFAULT_WEIGHTS,
    PipelineCache,
    build_pipeline,
    default_pipeline,
    weights_of,
)
from souq.placement.request import PlacementRequest, WantedImage, short_digest
from souq.placement.scorers import (
    NOMAD_MAX_FIT,
    AntiAffinityScorer,
    BestFitScorer,
    BinPackScorer,
    CacheScorer,
    LoadScorer,
    SpreadScorer,
    nomad_binpack,
)
from souq.placement.stages import (
    Filter,
    Rejection,
    Scorer,
    Shortfall,
    shortfall,
    utilisation_after,
)

__all__ = [
    "DEFAULT_CURVE",
    "DEFAULT_WEIGHTS",
    "NOMAD_MAX_FIT",
    "NOT_SAMPLED",
    "AntiAffinityScorer",
    "BestFitScorer",
    "BinPackScorer",
    "CacheScorer",
    "ConstraintFilter",
    "Curve",
    "DistinctWorkersFilter",
    "DriverFilter",
    "EligibleFilter",
    "Filter",
    "GpuFilter",
    "LoadScorer",
    "Pipeline",
    "PipelineCache",
    "PlacementRequest",
    "Ranking",
    "RegionFilter",
    "Rejection",
    "ResourcesFilter",
    "Scorer",
    "Shortfall",
    "SpreadScorer",
    "StandbyFilter",
    "StateFilter",
    "WantedImage",
    "attribute_of",
    "build_pipeline",
    "default_pipeline",
    "nomad_binpack",
    "short_digest",
    "shortfall",
    "unmet",
    "utilisation_after",
    "weights_of",
]
