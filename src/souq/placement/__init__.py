"""Placement: a pure pipeline of filters and scorers. Imports nothing that does I/O."""

from souq.placement.curves import DEFAULT_CURVE, Curve
from souq.placement.pipeline import Pipeline, Ranking, default_pipeline
from souq.placement.request import PlacementRequest
from souq.placement.stages import (
    BestFitScorer,
    EligibleFilter,
    Filter,
    Rejection,
    ResourcesFilter,
    Scorer,
    Shortfall,
    shortfall,
    utilisation_after,
)

__all__ = [
    "DEFAULT_CURVE",
    "BestFitScorer",
    "Curve",
    "EligibleFilter",
    "Filter",
    "Pipeline",
    "PlacementRequest",
    "Ranking",
    "Rejection",
    "ResourcesFilter",
    "Scorer",
    "Shortfall",
    "default_pipeline",
    "shortfall",
    "utilisation_after",
]
