"""`souq machine show` of a preempted machine, and of the machine that displaced it."""

from __future__ import annotations

import pytest

from souq.client import render
from souq.clock import iso_from_ms
from souq.model import Machine, MachineConfig, MachineEvent, MachineState
from souq.model.placement import Placement, PreemptedMachine, Preemption


def machine(state: MachineState, events: list[MachineEvent], **more: object) -> Machine:
    config = MachineConfig.model_validate_json(
        '{"cmd": ["sleep", "600"], "priority_class": "spot", "max_price": 0.5}'
    )
    return Machine(
        id="m1",
        name="m1",
        app="batch",
        region="mad",
        worker_id="w1",
        state=state,
        config=config,
        created_at=iso_from_ms(0),
        updated_at=iso_from_ms(0),
        events=events,
        **more,  # type: ignore[arg-type]
    )


def test_a_stopped_victim_shows_its_class_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    why = "preempted by machine m9 of app web: priority_class standard displaces spot"
    events = [
        MachineEvent(type="exit", status=MachineState.STOPPED, source="agent", timestamp=3),
        MachineEvent(
            type="preempted", status=MachineState.STOPPING, source="agent", timestamp=2, message=why
        ),
    ]
    render.machine(machine(MachineState.STOPPED, events))
    out = " ".join(capsys.readouterr().out.split())
    assert "class spot, bids at most 0.5" in out
    assert "reason preempted by machine m9 of app web" in out


def test_the_taker_shows_whom_it_displaced(capsys: pytest.CaptureFixture[str]) -> None:
    record = Placement(
        request_id="r1",
        region="mad",
        winner="w1",
        preemption=Preemption(
            priority_class="standard", displaces=["spot"], max_victims=8, reason="no room"
        ),
        preempted=[
            PreemptedMachine(
                machine_id="m1",
                app="batch",
                priority_class="spot",
                max_price=0.5,
                cpus=1,
                memory_mb=256,
                running=True,
                reason="standard displaces spot",
            )
        ],
    )
    render.machine(machine(MachineState.STARTED, [], placement=record))
    out = " ".join(capsys.readouterr().out.split())
    assert "preemption: no room; standard may displace spot (at most 8 machines)" in out
    assert "displaced m1 (app batch, spot, bid 0.5, 1 cpus / 256 MiB)" in out


def test_a_machine_under_notice_shows_when_it_stops(capsys: pytest.CaptureFixture[str]) -> None:
    notice = "the spot price in region mad rose to 0.6 an hour (90% used), above its max_price 0.5"
    events = [
        MachineEvent(
            type="preempt_notice",
            status=MachineState.STARTED,
            source="agent",
            timestamp=2,
            message=f"{notice}: it stops in 120 s, at 1970-01-01T00:02:00.002Z",
        ),
        MachineEvent(type="start", status=MachineState.STARTED, source="agent", timestamp=1),
    ]
    render.machine(machine(MachineState.STARTED, events))
    out = " ".join(capsys.readouterr().out.split())
    assert f"notice {notice}: it stops in 120 s" in out
