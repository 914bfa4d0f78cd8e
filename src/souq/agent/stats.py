"""What the agent counts as it works, for its metrics (:mod:`souq.agent.metrics`): plain
counters and readers, with no dependency on the metrics library."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["RESOURCES", "AgentStats"]

RESOURCES = ("cpus", "memory_mb", "disk_mb", "gpus")


@dataclass
class AgentStats:
    """What the agent counts as it works (bumped on the event loop, read by scrapes)."""

    claims: Counter[str] = field(default_factory=Counter)  # by outcome: "accepted", a refusal
    offers: int = 0
    last_heartbeat: float | None = None  # time.time() of the last one sent
    capacity: Callable[[], object] | None = None  # Resources-like: RESOURCES attributes
    allocated: Callable[[], object] | None = None
    pending_events: Callable[[], int] | None = None
    connected: Callable[[], bool] | None = None

    def claimed(self, outcome: str) -> None:
        self.claims[outcome] += 1
