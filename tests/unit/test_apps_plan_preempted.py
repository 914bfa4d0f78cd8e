"""Machines that preemption displaced, as a deploy's plan sees them: a served group's are
re-placed (a new machine, then the displaced one destroyed, each saying why); a group without
services leaves its to its standby. Pure."""

from __future__ import annotations

from dataclasses import replace

from souq.apps import load_app_config
from souq.apps.plan import Current, plan, scale
from souq.client.deploy import current_machines, preemption
from souq.model.machine import Machine, MachineEvent, MachineState

CONFIG = load_app_config(
    """\
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
"""
)
WHY = "preempted by machine m9 of app prod: priority_class reserved displaces spot"


def current(machine_id: str, group: str, preempted: str = "") -> Current:
    state = "stopped" if preempted else "started"
    return Current(machine_id, group, "mad", state, release=1, preempted=preempted)


def test_a_scale_to_the_same_counts_replaces_a_displaced_served_machine() -> None:
    now = [current("a1", "app"), current("a2", "app", WHY), current("w1", "worker")]
    phases = scale(CONFIG, now, ["mad"])
    assert [p.name for p in phases] == ["scale", "cleanup"]
    (create,) = phases[0].steps
    assert (create.action, create.group) == ("create", "app")
    assert create.why == "in the place of machine a2, preempted"
    (destroy,) = phases[1].steps
    assert (destroy.action, destroy.machine_id, destroy.why) == (
        "destroy",
        "a2",
        f"replaced: {WHY}",
    )
    assert phases[0].wait_healthy and not phases[1].wait_healthy  # gone once the new is up
    # Nothing displaced: nothing to do.
    assert scale(CONFIG, [replace(m, preempted="") for m in now], ["mad"]) == []


def test_a_deploy_replaces_it_too_and_a_group_without_services_leaves_it_to_its_standby() -> None:
    now = [current("a1", "app"), current("a2", "app", WHY), current("w1", "worker", WHY)]
    phases = plan(CONFIG, now, "rolling")
    steps = [(s.action, s.group, s.machine_id) for p in phases for s in p.steps]
    assert ("update", "app", "a1") in steps and ("create", "app", None) in steps
    assert ("update", "worker", "w1") in steps  # kept: its standby serves in its place
    assert ("destroy", "app", "a2") in steps and ("update", "app", "a2") not in steps


def _machine(*types: str) -> Machine:
    events = [
        MachineEvent(
            type=t, status=MachineState.STOPPED, source="agent", message=f"{t}!", timestamp=1
        )
        for t in types
    ]
    return Machine.model_validate(
        {
            "id": "m1",
            "app": "web",
            "name": "m1",
            "region": "mad",
            "worker_id": "w1",
            "state": "stopped",
            "config": {
                "cmd": ["serve"],
                "guest": {"cpus": 1},
                "metadata": {"souq_process_group": "app"},
            },
            "created_at": "2026-12-03T08:00:00Z",
            "updated_at": "2026-12-03T08:00:00Z",
            "events": [e.model_dump() for e in events],
        }
    )


def test_a_machine_is_displaced_until_it_starts_again() -> None:
    assert preemption(_machine("stop", "preempted", "start")) == "preempted!"  # newest first
    assert preemption(_machine("start", "preempted")) == ""
    assert preemption(_machine("stop")) == ""
    (seen,) = current_machines([_machine("preempted")])
    assert seen.preempted == "preempted!" and seen.group == "app"
