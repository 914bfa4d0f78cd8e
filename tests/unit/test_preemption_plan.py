"""Which machines a new one displaces (souq.market.preemption): pure."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from souq.market.preemption import Candidate, Eviction, may_displace, may_preempt, plan_eviction
from souq.model.resources import Resources
from souq.placement.stages import shortfall

CAP = Resources(cpus=4, memory_mb=4096)


def res(cpus: float, memory_mb: int = 256) -> Resources:
    return Resources(cpus=cpus, memory_mb=memory_mb)


def victim(
    mid: str,
    cpus: float = 1,
    klass: str = "spot",
    price: float | None = None,
    *,
    running: bool = True,
    created_at: int = 0,
) -> Candidate:
    return Candidate(
        machine_id=mid,
        app="batch",
        priority_class=klass,
        resources=res(cpus),
        price=price,
        running=running,
        created_at=created_at,
    )


def plan(
    want: Resources, candidates: list[Candidate], claimant: str = "standard", n: int = 8
) -> Eviction | None:
    used = Resources.zero()
    for c in candidates:
        used = used.plus(c.resources)
    return plan_eviction(
        want,
        capacity=CAP,
        in_use=used,
        gpu_free=(),
        candidates=candidates,
        claimant=claimant,
        max_victims=n,
    )


def ids(eviction: Eviction | None) -> list[str]:
    assert eviction is not None
    return [v.machine_id for v in eviction.victims]


def test_classes_displace_only_lower_ones_and_reserved_never() -> None:
    assert may_displace("reserved", "standard") and may_displace("reserved", "spot")
    assert may_displace("standard", "spot")
    assert not may_displace("standard", "standard") and not may_displace("spot", "spot")
    assert not may_displace("reserved", "reserved") and not may_displace("standard", "reserved")
    assert not may_preempt("spot") and may_preempt("standard")


def test_a_machine_that_fits_displaces_nobody() -> None:
    got = plan(res(1), [victim("a"), victim("b")])  # 2 of 4 cpus used
    assert got is not None and got.victims == ()


def test_the_cheapest_bid_goes_first_and_no_more_than_needed() -> None:
    full = [victim("a", price=3), victim("b", price=1), victim("c", price=2), victim("d")]
    assert ids(plan(res(1), full)) == ["b"]
    assert sorted(ids(plan(res(2), full))) == ["b", "c"]


def test_a_machine_without_a_price_goes_last_in_its_class() -> None:
    full = [victim("a"), victim("b", price=5), victim("c"), victim("d")]
    assert ids(plan(res(1), full)) == ["b"]


def test_spot_goes_before_standard_whatever_the_prices() -> None:
    full = [
        victim("std", klass="standard", price=0),
        victim("s1", price=9),
        victim("s2", price=9),
        victim("s3", price=9),
    ]
    assert ids(plan(res(1), full, claimant="reserved")) == ["s1"]


def test_standard_is_not_displaced_by_standard_nor_reserved_by_anyone() -> None:
    full = [victim(f"r{i}", klass="reserved") for i in range(4)]
    assert plan(res(1), full, claimant="reserved") is None
    full = [victim(f"s{i}", klass="standard") for i in range(4)]
    assert plan(res(1), full, claimant="standard") is None
    assert ids(plan(res(1), full, claimant="reserved")) == ["s0"]


def test_spot_displaces_nobody() -> None:
    assert plan(res(1), [victim(f"s{i}") for i in range(4)], claimant="spot") is None


def test_fewest_machines_beat_cheaper_ones() -> None:
    # Three cheap 1-cpu victims or one dearer 3-cpu one: one machine is displaced.
    full = [victim("big", 3, price=10), victim("small", 1, price=1)]
    assert ids(plan(res(3), full)) == ["big"]


def test_a_victim_not_needed_once_the_others_go_is_spared() -> None:
    # Cheapest first takes a (1 cpu) then big (3); big alone frees enough: a is spared.
    full = [victim("a", 1, price=1), victim("big", 3, price=2)]
    assert ids(plan(res(3), full)) == ["big"]


def test_stopped_machines_go_before_running_ones_of_the_same_bid() -> None:
    full = [victim("run", price=1), victim("idle", price=1, running=False), victim("x", 2)]
    assert ids(plan(res(1), full)) == ["idle"]


def test_no_more_than_max_victims() -> None:
    full = [victim(f"s{i}") for i in range(4)]
    assert plan(res(3), full, n=2) is None
    assert len(ids(plan(res(3), full, n=3))) == 3


def test_the_newest_goes_first_among_equals() -> None:
    full = [victim(f"s{i}", created_at=i) for i in range(4)]
    assert ids(plan(res(1), full)) == ["s3"]


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    prices=st.lists(st.one_of(st.none(), st.integers(0, 5)), min_size=6, max_size=6),
    want=st.integers(1, 8),
)
def test_a_plan_is_minimal_and_makes_room(
    sizes: list[int], prices: list[int | None], want: int
) -> None:
    cap = Resources(cpus=8, memory_mb=8192)
    candidates = [
        Candidate(f"m{i}", "a", "spot", res(s / 2), price=prices[i]) for i, s in enumerate(sizes)
    ]
    used = Resources.zero()
    for c in candidates:
        used = used.plus(c.resources)
    wanted = res(want / 2)
    got = plan_eviction(
        wanted,
        capacity=cap,
        in_use=used,
        gpu_free=(),
        candidates=candidates,
        claimant="standard",
        max_victims=8,
    )
    possible = any(
        shortfall(wanted, cap, used.minus(_sum(combo))) is None
        for k in range(len(candidates) + 1)
        for combo in combinations(candidates, k)
    )
    assert (got is not None) == possible
    if got is None:
        return
    after = used.minus(got.freed)
    assert shortfall(wanted, cap, after) is None
    for spared in got.victims:  # every victim was needed
        assert shortfall(wanted, cap, after.plus(spared.resources)) is not None
    fewest = min(
        k
        for k in range(len(candidates) + 1)
        for combo in combinations(candidates, k)
        if shortfall(wanted, cap, used.minus(_sum(combo))) is None
    )
    assert len(got.victims) <= fewest + 1


def _sum(cs: tuple[Candidate, ...]) -> Resources:
    total = Resources.zero()
    for c in cs:
        total = total.plus(c.resources)
    return total


@pytest.mark.parametrize("claimant", ["reserved", "standard"])
def test_memory_counts_too(claimant: str) -> None:
    big = Candidate("mem", "a", "spot", Resources(cpus=0.5, memory_mb=3000))
    small = Candidate("cpu", "a", "spot", Resources(cpus=3, memory_mb=100), price=0)
    got = plan_eviction(
        Resources(cpus=0.5, memory_mb=2000),
        capacity=CAP,
        in_use=Resources(cpus=3.5, memory_mb=3100),
        gpu_free=(),
        candidates=[big, small],
        claimant=claimant,
        max_victims=8,
    )
    assert ids(got) == ["mem"]
