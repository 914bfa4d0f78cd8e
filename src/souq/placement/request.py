"""What the pipeline is asked to place: the parts of a machine config that filters and scorers
read, plus the request id that seeds every random choice."""

from __future__ import annotations

from dataclasses import dataclass

from souq.model.constraint import Constraint
from souq.model.machine import MachineConfig
from souq.model.resources import Resources

__all__ = ["PlacementRequest"]


@dataclass(frozen=True)
class PlacementRequest:
    request_id: str
    app: str
    region: str
    resources: Resources
    constraints: tuple[Constraint, ...] = ()
    distinct_workers_for: str | None = None  # "app": at most one machine of the app per worker
    artifact: str | None = None  # what the machine runs; cached on some workers
    driver: str = "exec"
    # A standby's: the workers of the machines it stands by for (it must not share their fate).
    avoid_workers: frozenset[str] = frozenset()

    @classmethod
    def for_machine(
        cls,
        request_id: str,
        app: str,
        region: str,
        config: MachineConfig,
        *,
        avoid_workers: frozenset[str] = frozenset(),
    ) -> PlacementRequest:
        """The request to place a machine of ``config``: the one place that reads a config."""
        return cls(
            avoid_workers=avoid_workers,
            request_id=request_id,
            app=app,
            region=region,
            resources=config.guest.resources(),
            constraints=tuple(config.constraints),
            distinct_workers_for=config.distinct_workers_for,
            artifact=config.artifact,
            driver=config.driver,
        )
