"""A deploy's plan under each strategy: pure, from the machines as they are and the config."""

from __future__ import annotations

from souq.apps import load_app_config
from souq.apps.plan import Current, Phase, desired_counts, plan, scale, standbys_wanted

BASE = """\
app = "web"
primary_region = "mad"
[build]
image = "web:v1"
[processes]
app = "serve"
worker = "work"
[http_service]
internal_port = 8080
processes = ["app"]
[deploy]
max_unavailable = 2
"""
REGIONS = BASE + "[regions]\nmad = 3\nsyd = 1\n"


def machines(*specs: tuple[str, str, int]) -> list[Current]:
    out = []
    for group, region, count in specs:
        out += [
            Current(id=f"{group}-{region}-{i}", group=group, region=region, state="started")
            for i in range(count)
        ]
    return out


def actions(phases: list[Phase]) -> list[tuple[str, list[tuple[str, str, str]]]]:
    return [(p.name, [(s.action, s.group, s.region) for s in p.steps]) for p in phases]


def test_high_availability_by_default() -> None:
    config = load_app_config(BASE)
    assert desired_counts(config, "app") == {"mad": 2}  # served: two
    assert desired_counts(config, "worker") == {"mad": 1}
    first = plan(config, [], "rolling")
    assert actions(first) == [
        ("new app in mad", [("create", "app", "mad")] * 2),
        ("new worker in mad", [("create", "worker", "mad")]),
    ]
    assert all(p.wait_healthy for p in first)


def test_rolling_goes_region_by_region_in_batches_then_cleans_up() -> None:
    config = load_app_config(REGIONS)
    now = machines(("app", "mad", 3), ("app", "syd", 2), ("worker", "mad", 1))
    phases = plan(config, now, "rolling")
    names = [p.name for p in phases]
    assert names == [
        "rolling app in mad (2/3)",
        "rolling app in mad (3/3)",
        "rolling worker in mad (1/1)",
        "new worker in mad",  # [regions] asks 3 of each group in mad
        "rolling app in syd (1/1)",
        "new worker in syd",
        "cleanup",
    ]
    assert [len(p.steps) for p in phases[:2]] == [2, 1]  # max_unavailable = 2
    assert actions(phases)[-1] == ("cleanup", [("destroy", "app", "syd")])  # syd wants one
    assert not phases[-1].wait_healthy


def test_canary_first_then_rolling() -> None:
    config = load_app_config(BASE)
    phases = plan(config, machines(("app", "mad", 2), ("worker", "mad", 1)), "canary")
    assert phases[0].name == "canary app in mad"
    (canary,) = phases[0].steps
    assert canary.action == "create" and canary.canary
    assert [p.name for p in phases[1:]] == [
        "rolling app in mad (2/2)",
        "rolling worker in mad (1/1)",
    ]


def test_bluegreen_makes_a_whole_green_set_before_blue_goes() -> None:
    config = load_app_config(REGIONS)
    now = machines(("app", "mad", 3), ("app", "syd", 1))
    green, switch = plan(config, now, "bluegreen")
    assert green.wait_healthy and len(green.steps) == 3 + 1 + 3 + 1
    assert {s.action for s in green.steps} == {"create"}
    assert not switch.wait_healthy
    assert sorted(s.machine_id or "" for s in switch.steps) == sorted(m.id for m in now)


def test_immediate_and_orphans() -> None:
    config = load_app_config(BASE)
    now = machines(("app", "mad", 2), ("old", "mad", 1), ("app", "ams", 1))
    phases = plan(config, now, "immediate")
    assert actions(phases) == [
        (
            "immediate",
            [("update", "app", "mad"), ("update", "app", "mad"), ("create", "worker", "mad")],
        ),
        ("cleanup", [("destroy", "old", "mad"), ("destroy", "app", "ams")]),
    ]
    assert not phases[0].wait_healthy


def test_standbys_are_updated_kept_stopped_and_go_with_their_machine() -> None:
    config = load_app_config(BASE)
    worker = Current(id="w1", group="worker", region="mad", state="started")
    standby = Current(id="s1", group="worker", region="mad", state="stopped", standby_for=("w1",))
    apps = machines(("app", "mad", 2))
    phases = plan(config, [*apps, worker, standby], "rolling")
    assert phases[-1].name == "standbys"
    (update,) = phases[-1].steps
    assert (update.action, update.machine_id, update.standby_for) == ("update", "s1", ("w1",))
    assert not phases[-1].wait_healthy
    # The standby does not count as a machine of the group: nothing new is made for it.
    assert all(s.action == "update" for p in phases for s in p.steps)
    # Blue-green replaces the machine: its standby goes with it.
    bluegreen = plan(config, [*apps, worker, standby], "bluegreen")
    assert ("destroy", "s1") in [(s.action, s.machine_id) for p in bluegreen for s in p.steps]
    # Which machines still lack one: the group without services only.
    assert standbys_wanted(config, [*apps, worker]) == [worker]
    assert standbys_wanted(config, [*apps, worker, standby]) == []


def test_rolling_updates_the_machines_at_rest_first_and_the_started_ones_last() -> None:
    # Two of three stopped by the proxy's autostop: a release that fails its checks fails on
    # one of them, while the started one goes on serving.
    config = load_app_config(BASE.replace("max_unavailable = 2", "max_unavailable = 1"))
    now = [
        Current(id="a", group="app", region="mad", state="started"),
        Current(id="b", group="app", region="mad", state="stopped"),
        Current(id="c", group="app", region="mad", state="suspended"),
    ]
    config = config.model_copy(update={"regions": {"mad": 3}})
    phases = plan(config, [*now, Current(id="w", group="worker", region="mad", state="started")])
    order = [s.machine_id for p in phases for s in p.steps if s.group == "app"]
    assert order == ["b", "c", "a"]
    # Which machines a group keeps when it shrinks is another matter: the started ones.
    shrunk = config.model_copy(update={"regions": {"mad": 1}})
    steps = [s for p in plan(shrunk, now) for s in p.steps if s.group == "app"]
    assert [(s.action, s.machine_id) for s in steps] == [
        ("update", "a"),
        ("destroy", "b"),
        ("destroy", "c"),
    ]


def test_a_scale_only_creates_and_destroys_in_its_regions() -> None:
    config = load_app_config(REGIONS.replace("mad = 3", "mad = 4"))
    now = machines(("app", "mad", 3), ("app", "syd", 1), ("worker", "mad", 3), ("worker", "syd", 1))
    # mad: one machine more a group; syd is not named: untouched; nothing is updated.
    phases = scale(config, now, ["mad"])
    assert actions(phases) == [("scale", [("create", "app", "mad"), ("create", "worker", "mad")])]
    assert phases[0].wait_healthy
    # To the count the app has: nothing at all.
    assert scale(load_app_config(REGIONS), now, ["mad", "syd"]) == []
    # Down: the extras go, a stopped one first, with the standby that stands by for it.
    stopped = Current(id="w-stopped", group="worker", region="syd", state="stopped")
    standby = Current(
        id="s1", group="worker", region="syd", state="stopped", standby_for=("w-stopped",)
    )
    down = scale(load_app_config(REGIONS), [*now, stopped, standby], ["syd"])
    assert [(p.name, [s.machine_id for s in p.steps]) for p in down] == [
        ("cleanup", ["w-stopped", "s1"])
    ]
