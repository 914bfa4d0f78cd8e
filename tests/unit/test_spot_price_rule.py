"""A region's spot price from its utilisation, who may overwrite a published one, and whom a
price outbids (souq.market.prices): pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from souq.broker.config import BrokerConfig
from souq.market.prices import (
    Bid,
    multiplier,
    outbid,
    price_at,
    refuses,
    region_price,
    region_prices,
    supersedes,
)
from souq.model.prices import SpotPrice, SpotPriceRule
from souq.model.resources import Resources
from souq.model.worker import WorkerInfo, WorkerState

RULE = SpotPriceRule()  # floor 0.01, knee 0.5, peak 10


def worker(
    wid: str,
    used_cpus: float,
    *,
    cpus: float = 4,
    memory_mb: int = 4096,
    used_mb: int = 0,
    region: str = "mad",
    state: WorkerState = WorkerState.UP,
    version: int = 1,
) -> WorkerInfo:
    return WorkerInfo(
        id=wid,
        region=region,
        state=state,
        capacity=Resources(cpus=cpus, memory_mb=memory_mb),
        allocated=Resources(cpus=used_cpus, memory_mb=used_mb),
        version=version,
    )


def sample(price: float, *, versions: int = 1, at_ms: int = 0) -> SpotPrice:
    return SpotPrice(
        region="mad",
        price=price,
        used=0.5,
        cpu_used=0.5,
        memory_used=0.0,
        at_ms=at_ms,
        versions=versions,
    )


def test_the_price_holds_at_the_floor_up_to_the_knee_then_rises_linearly_to_the_peak() -> None:
    assert price_at(RULE, 0.0) == 0.01
    assert price_at(RULE, 0.5) == 0.01
    assert price_at(RULE, 0.75) == pytest.approx(0.01 * 5.5)
    assert price_at(RULE, 1.0) == pytest.approx(0.1)
    assert price_at(RULE, 1.7) == price_at(RULE, 1.0)  # clipped: a full region is the peak
    flat = SpotPriceRule(floor=2, knee=0, peak=1)
    assert {price_at(flat, u / 10) for u in range(11)} == {2.0}


@given(st.floats(0, 1), st.floats(0, 1))
def test_a_fuller_region_never_costs_less(a: float, b: float) -> None:
    low, high = sorted((a, b))
    assert multiplier(RULE, low) <= multiplier(RULE, high)
    assert 1.0 <= multiplier(RULE, low) <= RULE.peak


def test_the_used_fraction_is_the_fuller_resource_over_the_live_workers() -> None:
    # Two workers of 4 cpus: 5 promised of 8 (cpus dominate) -> 62.5 % used.
    price = region_price("mad", [worker("a", 4), worker("b", 1)], RULE, at_ms=7)
    assert price is not None
    assert (price.cpu_used, price.used, price.at_ms) == (0.625, 0.625, 7)
    assert price.price == price_at(RULE, 0.625)
    # Memory fuller than cpus: memory decides.
    price = region_price("mad", [worker("a", 1, used_mb=3072)], RULE, at_ms=0)
    assert price is not None and price.used == 0.75 and price.memory_used == 0.75


def test_a_down_worker_takes_its_room_away_but_keeps_its_version_in_the_sum() -> None:
    workers = [worker("a", 2, version=5), worker("b", 0, state=WorkerState.DOWN, version=9)]
    price = region_price("mad", workers, RULE, at_ms=0)
    assert price is not None
    assert price.used == 0.5  # 2 of a's 4: b's room is gone
    assert price.versions == 14
    cordoned = [worker("a", 2), worker("b", 0, state=WorkerState.CORDONED)]
    price = region_price("mad", cordoned, RULE, at_ms=0)
    assert price is not None and price.used == 0.25  # a cordoned worker's room still counts


def test_a_region_without_live_capacity_has_no_price_and_regions_are_kept_apart() -> None:
    assert region_price("mad", [worker("a", 0, state=WorkerState.DOWN)], RULE, at_ms=0) is None
    prices = region_prices([worker("a", 4), worker("b", 0, region="syd")], RULE, at_ms=0)
    assert sorted(prices) == ["mad", "syd"]
    assert prices["mad"].price == pytest.approx(0.1) and prices["syd"].price == 0.01


def test_a_figure_is_published_when_it_changed_and_its_view_is_not_older() -> None:
    published = sample(0.02, versions=10, at_ms=1_000)
    assert supersedes(sample(0.02), None, now_ms=0, stale_ms=10_000)
    assert not supersedes(sample(0.02, versions=99), published, now_ms=2_000, stale_ms=10_000)
    assert supersedes(sample(0.03, versions=10), published, now_ms=2_000, stale_ms=10_000)
    assert supersedes(sample(0.03, versions=11), published, now_ms=2_000, stale_ms=10_000)
    # An older view does not overwrite a newer one's figure...
    assert not supersedes(sample(0.01, versions=9), published, now_ms=2_000, stale_ms=10_000)
    # ... unless that figure is stale (a worker's ledger started again, say).
    assert supersedes(sample(0.01, versions=9), published, now_ms=11_000, stale_ms=10_000)


def test_only_a_spot_create_bidding_below_the_price_is_refused() -> None:
    price = sample(0.05)
    assert refuses("spot", 0.04, price)
    assert not refuses("spot", 0.05, price)  # at the price: it may run
    assert not refuses("spot", None, price)  # no limit
    assert not refuses("standard", 0.0, price)  # other classes are not priced
    assert not refuses("reserved", 0.0, price)
    assert not refuses("spot", 0.0, None)  # no price: no live capacity


def test_a_price_outbids_the_running_spot_machines_that_bid_less_cheapest_first() -> None:
    machines = [
        Bid("m3", "spot", 0.03, running=True),
        Bid("m1", "spot", 0.01, running=True),
        Bid("m5", "spot", 0.05, running=True),
        Bid("stopped", "spot", 0.0, running=False),
        Bid("nolimit", "spot", None, running=True),
        Bid("std", "standard", 0.0, running=True),
    ]
    assert [b.machine_id for b in outbid(machines, 0.05)] == ["m1", "m3"]
    assert outbid(machines, 0.01) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("floor", -1), ("knee", 1.0), ("knee", -0.1), ("peak", 0.5), ("interval_s", 0), ("x", 1)],
)
def test_a_bad_rule_is_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        BrokerConfig(nats_url="nats://x", spot_price={field: value})  # type: ignore[arg-type]
