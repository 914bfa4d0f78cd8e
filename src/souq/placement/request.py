"""What the pipeline is asked to place."""

from __future__ import annotations

from dataclasses import dataclass

from souq.model.resources import Resources

__all__ = ["PlacementRequest"]


@dataclass(frozen=True)
class PlacementRequest:
    request_id: str
    app: str
    region: str
    resources: Resources
