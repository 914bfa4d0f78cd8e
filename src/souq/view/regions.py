"""Regions as a caller sizing a deploy sees them: workers up and down, how many more machines
of a given size fit, and the spot price (filled in by the broker, :mod:`souq.market.prices`).
Pure: computed from the worker table."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import Field

from souq.model import Record, Resources, WorkerInfo, WorkerState
from souq.model.prices import SpotPrice

__all__ = ["RegionSummary", "default_region", "fits", "next_region", "summarise_regions"]


class RegionSummary(Record):
    name: str
    workers: int
    workers_up: int = Field(description="up and taking machines")
    workers_cordoned: int = Field(description="cordoned or draining: no new machines")
    workers_down: int
    capacity: Resources = Field(description="summed over the workers up or cordoned")
    allocated: Resources
    machines: int = Field(description="machines not destroyed, as the workers last reported")
    fits: int = Field(
        description="machines of the asked size that fit: over up workers, floor(free / size) "
        "per resource, the least across resources, summed"
    )
    spot_price: float | None = Field(
        default=None,
        description="what a spot machine pays here, per hour: a spot create bidding less "
        "(`max_price`) is refused, a running spot machine bidding less is preempted "
        "(docs/placement.md, Spot prices); none: no live capacity",
    )
    spot_price_used: float | None = Field(
        default=None, description="the used fraction (0 … 1) the spot price comes from"
    )
    spot_price_at_ms: int | None = Field(
        default=None, description="when the spot price was worked out (ms since the epoch)"
    )
    spot_price_source: str | None = Field(
        default=None,
        description="`published`: the figure in the cluster's bucket, which the workers "
        "enforce; `view`: this broker's own figure, none published yet",
    )
    spot_price_history: list[SpotPrice] = Field(
        default_factory=list,
        description="the region's recent published prices, oldest first (each change, the last 64)",
    )


def fits(worker: WorkerInfo, size: Resources) -> int:
    """How many machines of ``size`` fit in what ``worker`` has free."""
    free = worker.capacity.minus(worker.allocated)
    pairs = [
        (free.millicpus, size.millicpus),
        (free.memory_mb, size.memory_mb),
        (free.disk_mb, size.disk_mb),
        (free.gpus, size.gpus),
    ]
    counts = [max(0, have // need) for have, need in pairs if need > 0]
    return min(counts) if counts else 0


def summarise_regions(workers: Iterable[WorkerInfo], size: Resources) -> list[RegionSummary]:
    by_region: dict[str, list[WorkerInfo]] = {}
    for w in workers:
        by_region.setdefault(w.region, []).append(w)
    out = []
    for name in sorted(by_region):
        ws = by_region[name]
        live = [w for w in ws if w.state != WorkerState.DOWN]
        out.append(
            RegionSummary(
                name=name,
                workers=len(ws),
                workers_up=sum(w.state == WorkerState.UP for w in ws),
                workers_cordoned=sum(
                    w.state in (WorkerState.CORDONED, WorkerState.DRAINING) for w in ws
                ),
                workers_down=sum(w.state == WorkerState.DOWN for w in ws),
                capacity=_sum(w.capacity for w in live),
                allocated=_sum(w.allocated for w in live),
                machines=sum(w.machines for w in live),
                fits=sum(fits(w, size) for w in ws if w.state == WorkerState.UP),
            )
        )
    return out


def _sum(items: Iterable[Resources]) -> Resources:
    total = Resources.zero()
    for r in items:
        total = total.plus(r)
    return total


def default_region(
    app_machines: Mapping[str, int], regions: Iterable[RegionSummary]
) -> tuple[str, str] | None:
    """Where a create that names no region goes, and why: the region holding most of the app's
    machines (as Fly's primary region), else the one where most machines of the size fit.
    None when no region has a worker up."""
    if app_machines:
        region = max(sorted(app_machines), key=lambda r: app_machines[r])
        return region, f"most of the app's machines ({app_machines[region]}) are in {region}"
    up = [r for r in regions if r.workers_up]
    if not up:
        return None
    best = max(sorted(up, key=lambda r: r.name), key=lambda r: r.fits)
    return best.name, f"{best.fits} machines of this size fit in {best.name}, the most"


def next_region(regions: Iterable[RegionSummary], tried: Iterable[str]) -> tuple[str, str] | None:
    """Where a create that named no region goes once the regions ``tried`` had no room for it
    (as a Nomad job spans its datacenters): the untried region with a worker up where the most
    machines of its size fit, and why. None when no other region has room."""
    done = set(tried)
    room = [r for r in regions if r.name not in done and r.workers_up and r.fits > 0]
    if not room:
        return None
    best = max(sorted(room, key=lambda r: r.name), key=lambda r: r.fits)
    return best.name, f"{best.fits} machines of this size fit in {best.name}, the most of the rest"
