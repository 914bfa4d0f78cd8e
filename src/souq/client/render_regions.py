"""How ``souq regions`` prints the regions: a part of :mod:`souq.client.render` (the only
printer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from souq.client.render import _listing
from souq.view.regions import RegionSummary

__all__ = ["regions", "sparkline"]

_BARS = "▁▂▃▄▅▆▇█"
TRAIL = 16  # recent prices drawn after the price


def sparkline(values: Sequence[float]) -> str:
    """``values`` as a row of bars, the lowest ▁ and the highest █ (all ▁ when flat)."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = high - low
    top = len(_BARS) - 1
    return "".join(_BARS[round((v - low) / span * top) if span else 0] for v in values)


def _price(r: RegionSummary) -> str:
    if r.spot_price is None:
        return "-"
    used = f" ({r.spot_price_used:.0%} used)" if r.spot_price_used is not None else ""
    return f"{r.spot_price:g}{used}"


def _row(r: RegionSummary) -> tuple[Any, ...]:
    recent = [p.price for p in r.spot_price_history[-TRAIL:]]
    return (
        r.name,
        f"{r.workers_up}/{r.workers}",
        f"{r.allocated.cpus:g}/{r.capacity.cpus:g}",
        f"{r.allocated.memory_mb}/{r.capacity.memory_mb} MiB",
        str(r.machines),
        str(r.fits),
        _price(r),
        sparkline(recent),
    )


def regions(items: Sequence[RegionSummary]) -> None:
    titles = ("REGION", "UP", "CPUS", "MEMORY", "MACHINES", "FITS", "SPOT PRICE", "RECENT")
    _listing(items, "regions", titles, _row)
