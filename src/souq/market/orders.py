"""What one auction places (:class:`Order`) and what for (:class:`Purpose`): the input the
auction (:mod:`souq.market.auction`) and its record (:mod:`souq.market.records`) share. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from souq.placement import PlacementRequest

__all__ = ["Order", "Purpose"]


class Purpose(StrEnum):
    CLAIM = "claim"  # make the machines
    HOLD = "hold"  # hold the capacity for a while (a quote)
    EXPLAIN = "explain"  # a dry run: rank, claim nothing


@dataclass(frozen=True)
class Order:
    """What to place: ``count`` machines like ``request`` (its resources, constraints,
    policy), at least ``min_count`` of them or none."""

    request: PlacementRequest
    count: int = 1
    min_count: int = 1
    purpose: Purpose = Purpose.CLAIM
    find_existing: bool = False  # an idempotent retry: ask offers to meet the earlier machine
    batch: bool = False  # a batch create (claim_batch, a batch record), whatever its count
    preempt: int = 0  # fitting nowhere, it may displace this many machines of a lower class
    priority_class: str = "standard"

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def region(self) -> str:
        return self.request.region
