"""The proxy's routing table: who can serve, who is picked, limits, drains, availability."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from souq.proxy.admission import VIEW_LAG_S, Admission
from souq.proxy.errors import AppNotFound
from souq.proxy.hooks import NoHooks
from souq.proxy.table import Availability, Backend, RoutingTable


def backend(
    machine_id: str,
    *,
    app: str = "web",
    region: str = "mad",
    state: str = "started",
    healthy: bool = True,
    soft: int = 2,
    hard: int = 3,
    autostart: bool = True,
    port: int = 8000,
) -> Backend:
    return Backend(
        machine_id=machine_id,
        app=app,
        region=region,
        worker_id="w1",
        host="127.0.0.1",
        port=port,
        state=state,
        healthy=healthy,
        soft_limit=soft,
        hard_limit=hard,
        autostart=autostart,
    )


def table_of(*backends: Backend, seed: int = 7, **kwargs: object) -> RoutingTable:
    table = RoutingTable(rng=random.Random(seed), **kwargs)
    for b in backends:
        table.upsert(b)
    return table


# -- the Backend record ------------------------------------------------------------------------


def test_a_backend_has_fly_s_default_limits() -> None:
    b = Backend(machine_id="m1", app="web", region="mad", host="127.0.0.1", port=1)
    assert (b.soft_limit, b.hard_limit, b.kind, b.autostart) == (20, 25, "connections", True)
    assert (b.state, b.healthy) == ("started", True)


@pytest.mark.parametrize(("soft", "hard"), [(5, 4), (0, 3), (1, 0)])
def test_a_backend_rejects_limits_that_cannot_hold(soft: int, hard: int) -> None:
    with pytest.raises(ValueError, match="limit"):
        backend("m1", soft=soft, hard=hard)


# -- who can serve -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "other",
    [
        backend("m2", state="stopped"),
        backend("m2", state="suspended"),
        backend("m2", state="starting"),
        backend("m2", healthy=False),
    ],
)
def test_only_started_healthy_machines_are_picked(other: Backend) -> None:
    table = table_of(backend("m1"), other)
    picked = Counter(table.pick("web", region="mad").machine_id for _ in range(50))
    assert picked == {"m1": 50}


def test_a_draining_machine_leaves_rotation_and_its_requests_finish() -> None:
    table = table_of(backend("m1"), backend("m2"))
    slot = table.claim_machine("m1")
    assert slot is not None
    assert table.draining("m1") == 1  # one still in flight
    assert table.is_draining("m1")
    assert all(table.pick("web").machine_id == "m2" for _ in range(20))
    assert table.claim_machine("m1") is None
    table.release(slot)
    assert table.load("m1") == 0
    assert table.draining("m1", False) == 0
    assert {table.pick("web").machine_id for _ in range(50)} == {"m1", "m2"}


def test_a_new_state_ends_a_drain() -> None:
    table = table_of(backend("m1"))
    table.draining("m1")
    table.upsert(backend("m1", state="stopped"))
    table.upsert(backend("m1"))
    assert not table.is_draining("m1")
    assert table.pick("web") is not None


def test_an_unknown_app_has_nothing_to_pick() -> None:
    assert table_of(backend("m1")).pick("other") is None
    assert table_of().claim("web") is None


# -- balancing -----------------------------------------------------------------------------------


def test_the_least_loaded_machine_is_picked() -> None:
    table = table_of(backend("m1", soft=10, hard=20), backend("m2", soft=10, hard=20))
    for _ in range(3):
        table.claim_machine("m1")
    picks = []
    for _ in range(6):
        slot = table.claim("web", "mad")
        assert slot is not None
        picks.append(slot.machine_id)
    # m2 catches up (3 picks), then they alternate as equals.
    assert picks[:3] == ["m2", "m2", "m2"]
    assert table.load("m1") + table.load("m2") == 9
    assert abs(table.load("m1") - table.load("m2")) <= 1


def test_equals_are_picked_at_random_from_a_seeded_generator() -> None:
    def picks(seed: int) -> list[str]:
        table = table_of(backend("m1"), backend("m2"), backend("m3"), seed=seed)
        return [table.pick("web").machine_id for _ in range(300)]

    first = picks(1)
    assert first == picks(1)  # reproducible
    counts = Counter(first)
    assert set(counts) == {"m1", "m2", "m3"}
    assert min(counts.values()) > 60  # about a third each


def test_the_own_region_wins_while_below_the_soft_limit() -> None:
    table = table_of(backend("near", region="mad"), backend("far", region="syd"))
    assert table.claim("web", "mad").machine_id == "near"
    assert table.claim("web", "mad").machine_id == "near"
    # near is at its soft limit (2): the far machine, below its own, comes first now.
    assert table.claim("web", "mad").machine_id == "far"
    assert table.claim("web", "mad").machine_id == "far"
    # Both at soft limit: between soft and hard, the near one again.
    assert table.claim("web", "mad").machine_id == "near"
    assert table.claim("web", "mad").machine_id == "far"
    # Both at their hard limit (3): nothing.
    assert table.claim("web", "mad") is None
    assert table.availability("web") is Availability.FULL


def test_nearby_regions_come_before_the_rest() -> None:
    table = table_of(
        backend("a", region="syd"),
        backend("b", region="lhr"),
        backend("c", region="cdg"),
        nearby={"mad": ["cdg", "lhr"]},
    )
    assert table.pick("web", region="mad").machine_id == "c"
    assert table.pick("web", region="syd").machine_id == "a"


def test_without_a_region_every_region_is_equal() -> None:
    table = table_of(backend("a", region="syd"), backend("b", region="mad"))
    assert {table.pick("web").machine_id for _ in range(50)} == {"a", "b"}


def test_a_machine_at_its_hard_limit_is_never_picked() -> None:
    table = table_of(backend("m1", soft=1, hard=1))
    slot = table.claim("web")
    assert slot is not None
    assert table.claim("web") is None
    assert table.pick("web") is None
    table.release(slot)
    assert table.pick("web") is not None


def test_exclude_and_only_region_narrow_the_choice() -> None:
    table = table_of(backend("m1"), backend("m2", region="syd"))
    assert table.pick("web", exclude=("m1",)).machine_id == "m2"
    assert table.pick("web", exclude=("m1", "m2")) is None
    assert table.pick("web", region="mad", only_region="syd").machine_id == "m2"
    assert table.pick("web", only_region="lhr") is None


def test_pick_counts_nothing_and_claim_counts_one() -> None:
    table = table_of(backend("m1"))
    table.pick("web")
    assert table.load("m1") == 0
    slot = table.claim("web")
    assert slot is not None
    assert table.load("m1") == 1
    table.release(slot)
    assert table.load("m1") == 0


# -- the control plane's writes -------------------------------------------------------------------


def test_upsert_keeps_the_load_and_remove_forgets() -> None:
    table = table_of(backend("m1"))
    slot = table.claim("web")
    assert slot is not None
    table.upsert(backend("m1", port=9000))
    assert table.load("m1") == 1
    assert table.get("m1").port == 9000
    assert slot.address == ("127.0.0.1", 9000)
    removed = table.remove("m1")
    assert removed is not None
    assert removed.machine_id == "m1"
    assert table.remove("m1") is None
    assert table.apps() == []
    table.release(slot)  # a late release of a removed machine is harmless
    assert table.load("m1") == 0


def test_a_machine_may_move_to_another_app() -> None:
    table = table_of(backend("m1"))
    table.upsert(backend("m1", app="api"))
    assert table.apps() == ["api"]
    assert [b.machine_id for b in table.backends("api")] == ["m1"]
    assert table.backends("web") == []


def test_set_healthy_takes_a_machine_out_and_back() -> None:
    table = table_of(backend("m1"))
    table.set_healthy("m1", False)
    assert table.pick("web") is None
    # Started, its checks failing: a request waits for it to pass them (or for its deadline).
    assert table.availability("web") is Availability.PENDING
    table.set_healthy("m1", True)
    assert table.pick("web") is not None
    table.set_healthy("nope", True)  # unknown machines are ignored


def test_listeners_hear_every_change_but_not_plain_claims_and_releases() -> None:
    table = table_of()
    heard: list[str] = []
    table.subscribe(heard.append)
    table.upsert(backend("m1"))
    table.set_healthy("m1", False)
    table.set_healthy("m1", False)  # no change, nothing heard
    table.set_healthy("m1", True)
    table.draining("m1")
    slot = table.claim_machine("m1")
    assert slot is None  # draining
    table.draining("m1", False)
    slot = table.claim("web")
    assert slot is not None
    table.release(slot)
    table.remove("m1")
    assert heard == ["web"] * 6


# -- availability -------------------------------------------------------------------------------


def test_availability_says_why_nothing_was_claimed() -> None:
    assert table_of().availability("web") is Availability.UNKNOWN
    assert table_of(backend("m1")).availability("web") is Availability.OPEN
    stopped = backend("m1", state="stopped")
    assert table_of(stopped).availability("web") is Availability.WAKEABLE
    assert table_of(stopped).wakeable("web")
    manual = backend("m1", state="stopped", autostart=False)
    assert table_of(manual).availability("web") is Availability.NONE
    assert not table_of(manual).wakeable("web")
    starting = backend("m1", state="starting")
    assert table_of(starting).availability("web") is Availability.PENDING
    assert table_of(backend("m1", state="destroyed")).availability("web") is Availability.NONE


def test_a_full_app_with_a_stopped_machine_is_full_and_wakeable() -> None:
    table = table_of(backend("m1", soft=1, hard=1), backend("m2", state="suspended"))
    assert table.claim("web") is not None
    assert table.availability("web") is Availability.FULL
    assert table.wakeable("web")
    table.draining("m2")
    assert not table.wakeable("web")


def test_a_slot_is_not_seen_listening_again_once_its_machine_starts_again() -> None:
    table = RoutingTable()
    table.upsert(backend("m1"))
    slot = table.claim("web")
    assert slot is not None and not slot.listened
    slot.listened = True  # the relay connected to it
    table.upsert(backend("m1"))  # the same record again: still the same process
    assert slot.listened
    table.upsert(backend("m1", state="stopped"))
    table.upsert(backend("m1"))
    assert not slot.listened  # started again: it may be binding its port still


def test_a_request_for_an_app_the_view_has_not_heard_of_yet_waits_for_it() -> None:
    async def body() -> None:
        table = RoutingTable()
        admission = Admission(table, NoHooks(), region="mad", queue_limit=8, timeout_s=10)
        loop = asyncio.get_running_loop()
        # Its machine's event comes a moment after the request: the request gets it.
        loop.call_later(VIEW_LAG_S / 10, table.upsert, backend("m1"))
        slot = await admission.claim("web", loop.time() + 10)
        assert slot.machine_id == "m1"
        # No news within the moment: 404 then, well before the request's deadline.
        t0 = loop.time()
        with pytest.raises(AppNotFound):
            await admission.claim("nope", loop.time() + 10)
        assert VIEW_LAG_S * 0.9 <= loop.time() - t0 < 10

    asyncio.run(body())
