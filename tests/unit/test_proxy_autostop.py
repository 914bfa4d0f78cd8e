"""Autostop's rule (souq.proxy.autostop): Fly's, per app and region, one machine a round."""

from __future__ import annotations

from souq.proxy.autostop import Running, choose


def running(
    mid: str, load: int = 0, *, region: str = "mad", app: str = "web", **kw: object
) -> Running:
    fields: dict[str, object] = {
        "soft_limit": 5,
        "autostop": "stop",
        "min_running": 0,
        **kw,
    }
    return Running(mid, app, region, load, **fields)  # type: ignore[arg-type]


def test_a_lone_idle_machine_stops_and_a_lone_busy_one_does_not() -> None:
    [idle] = choose([running("m1", 0)])
    assert (idle.machine_id, idle.action) == ("m1", "stop")
    assert "no load" in idle.reason
    assert choose([running("m1", 1)]) == []


def test_more_machines_than_the_load_needs_lose_the_least_loaded_one_per_round() -> None:
    [idle] = choose([running("m1", 3), running("m2", 0), running("m3", 2)])
    assert idle.machine_id == "m2"
    assert "3 machines running, 0 over their soft limit" in idle.reason


def test_machines_over_their_soft_limit_keep_one_spare_running() -> None:
    # Two running, one over its soft limit: the other is the headroom, it stays.
    assert choose([running("m1", 9), running("m2", 0)]) == []
    # Three running, one over: one more than needed.
    [idle] = choose([running("m1", 9), running("m2", 0), running("m3", 1)])
    assert idle.machine_id == "m2"


def test_min_machines_running_and_autostop_off_are_respected() -> None:
    assert choose([running("m1", 0, min_running=1)]) == []
    assert choose([running("m1", 0, min_running=2), running("m2", 0, min_running=2)]) == []
    assert choose([running("m1", 0, autostop="off")]) == []
    # Only the machines that may be stopped are candidates.
    [idle] = choose([running("m1", 0, autostop="off"), running("m2", 4)])
    assert idle.machine_id == "m2"


def test_suspend_is_what_a_suspending_service_gets() -> None:
    [idle] = choose([running("m1", 0, autostop="suspend")])
    assert idle.action == "suspend"


def test_each_app_and_region_is_judged_on_its_own() -> None:
    got = choose(
        [
            running("a1", 0, region="mad"),
            running("a2", 0, region="syd"),
            running("b1", 5, app="api"),
        ]
    )
    assert sorted((i.app, i.region, i.machine_id) for i in got) == [
        ("web", "mad", "a1"),
        ("web", "syd", "a2"),
    ]


def test_a_settling_machine_counts_as_running_but_is_never_chosen() -> None:
    # A machine a deploy just made proved itself a moment ago: it is not idle yet, alone...
    assert choose([running("new", 0, settling=True)]) == []
    # ...or beside others: it counts as running (one more than the load needs), another goes.
    [idle] = choose([running("new", 0, settling=True), running("old", 1)])
    assert idle.machine_id == "old"
    assert choose([running("new", 0, settling=True), running("old", 9)]) == []


def test_a_machine_whose_stop_a_lease_refused_is_not_chosen_while_it_lasts() -> None:
    assert choose([running("m1", 0, leased=True)]) == []
    [idle] = choose([running("m1", 0, leased=True), running("m2", 1), running("m3", 2)])
    assert idle.machine_id == "m2"
