"""A region's spot price, from its utilisation; and which spot machines it outbids. Pure.

**The rule** (:class:`~souq.model.prices.SpotPriceRule`, the broker's configuration)::

    used  = max(cpus promised / cpus, memory promised / memory)   over the region's live workers
    price = floor * (1                                       if used ≤ knee
                     1 + (peak - 1) * (used - knee) / (1 - knee)  above it)

so an idle region costs ``floor`` (0.01 an hour by default), the price holds until the region
is ``knee`` full (half), then rises linearly to ``peak`` times the floor (ten) when it is full.
Live workers are those up, cordoned or draining (a down worker's room is gone, so the price
of what is left rises); promised means reserved by machines of every class, as the workers'
ledgers say (their heartbeats). A region with no live capacity has no price.

**Who may overwrite a published figure** (:func:`supersedes`): every broker works the figure
out from its own view of the workers and publishes it when it differs from the one in the
bucket, unless its view is older than the one the figure came from (the sum of the workers'
ledger versions is smaller), so two brokers whose views differ for a heartbeat do not take
turns; a figure older than ``stale_ms`` yields to any (a worker's ledger started again).

**Whom a price outbids** (:func:`outbid`): running ``spot`` machines whose ``max_price`` is
below it, cheapest first. A machine without a ``max_price`` bids without limit and is never
outbid; ``standard`` and ``reserved`` machines are not priced.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from souq.model.choices import PriorityClass
from souq.model.prices import SpotPrice, SpotPriceRule
from souq.model.resources import Resources
from souq.model.worker import WorkerInfo, WorkerState

__all__ = [
    "BUCKET",
    "HISTORY",
    "Bid",
    "multiplier",
    "outbid",
    "price_at",
    "refuses",
    "region_price",
    "region_prices",
    "supersedes",
    "used_fraction",
]

DIGITS = 6  # a price is rounded to this many decimals: a figure that did not change is equal
BUCKET = "souq-spot-prices"  # JetStream key-value: one key per region, its recent figures kept
HISTORY = 64  # figures the bucket keeps of each region (JetStream's most)


def multiplier(rule: SpotPriceRule, used: float) -> float:
    """How many floors a region ``used`` full (0 … 1, clipped) costs."""
    used = min(1.0, max(0.0, used))
    if used <= rule.knee:
        return 1.0
    return 1.0 + (rule.peak - 1.0) * (used - rule.knee) / (1.0 - rule.knee)


def price_at(rule: SpotPriceRule, used: float) -> float:
    """The price of a region ``used`` full."""
    return round(rule.floor * multiplier(rule, used), DIGITS)


def used_fraction(capacity: Resources, allocated: Resources) -> tuple[float, float]:
    """Cpus and memory promised over what there is (1 where there is none)."""
    return _fractions(
        capacity.millicpus, capacity.memory_mb, allocated.millicpus, allocated.memory_mb
    )


def _fractions(cpu_have: int, mem_have: int, cpu_used: int, mem_used: int) -> tuple[float, float]:
    cpu = cpu_used / cpu_have if cpu_have else 1.0
    memory = mem_used / mem_have if mem_have else 1.0
    return min(1.0, max(0.0, cpu)), min(1.0, max(0.0, memory))


def region_price(
    region: str, workers: Iterable[WorkerInfo], rule: SpotPriceRule, *, at_ms: int
) -> SpotPrice | None:
    """``region``'s price from ``workers`` (any region's; the others are skipped); None when
    it has no live capacity."""
    cpu_have = mem_have = cpu_used = mem_used = versions = 0
    for w in workers:
        if w.region != region:
            continue
        versions += w.version  # down ones too: a worker going down makes no view older
        if w.state is not WorkerState.DOWN:
            cpu_have += w.capacity.millicpus
            mem_have += w.capacity.memory_mb
            cpu_used += w.allocated.millicpus
            mem_used += w.allocated.memory_mb
    if not cpu_have and not mem_have:
        return None
    cpu, memory = _fractions(cpu_have, mem_have, cpu_used, mem_used)
    used = max(cpu, memory)
    return SpotPrice(
        region=region,
        price=price_at(rule, used),
        used=round(used, DIGITS),
        cpu_used=round(cpu, DIGITS),
        memory_used=round(memory, DIGITS),
        at_ms=at_ms,
        versions=versions,
    )


def region_prices(
    workers: Iterable[WorkerInfo], rule: SpotPriceRule, *, at_ms: int
) -> dict[str, SpotPrice]:
    """Every region's price (those with live capacity), by name."""
    listed = list(workers)
    out = {}
    for region in sorted({w.region for w in listed}):
        price = region_price(region, listed, rule, at_ms=at_ms)
        if price is not None:
            out[region] = price
    return out


def supersedes(
    fresh: SpotPrice, published: SpotPrice | None, *, now_ms: int, stale_ms: int
) -> bool:
    """Whether a broker that worked out ``fresh`` should publish it over ``published``."""
    if published is None:
        return True
    if fresh.price == published.price:
        return False
    return fresh.versions >= published.versions or now_ms - published.at_ms >= stale_ms


def refuses(priority_class: str, max_price: float | None, price: SpotPrice | None) -> bool:
    """Whether a create of this class and bid is refused at ``price``: a ``spot`` machine
    bidding less than it."""
    return (
        priority_class == PriorityClass.SPOT
        and max_price is not None
        and price is not None
        and max_price < price.price
    )


@dataclass(frozen=True)
class Bid:
    """A machine as the price sees it."""

    machine_id: str
    priority_class: str
    max_price: float | None
    running: bool


def outbid(machines: Iterable[Bid], price: float) -> list[Bid]:
    """The running spot machines whose bid is below ``price``, cheapest first."""
    losing = [
        m
        for m in machines
        if m.running
        and m.priority_class == PriorityClass.SPOT
        and m.max_price is not None
        and m.max_price < price
    ]
    return sorted(losing, key=lambda m: (m.max_price, m.machine_id))
