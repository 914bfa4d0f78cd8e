"""Operations as tables: each path through, recovery from every waiting state, illegal steps."""

from __future__ import annotations

import pytest

from souq.agent.state.events import Event
from souq.agent.state.operations import TABLES, Action, OpKind, OpState, Step, advance
from souq.errors import IllegalTransition

K, St, Ev, A = OpKind, OpState, Event, Action


def walk(kind: OpKind, *events: Event) -> list[Step]:
    state, steps = St.NEW, []
    for event in events:
        step = advance(kind, state, event)
        steps.append(step)
        state = step.next
    return steps


def test_create_spawns_and_finishes() -> None:
    steps = walk(K.CREATE, Ev.BEGIN, Ev.SPAWNED)
    assert steps == [Step(St.SPAWNING, (A.SPAWN,)), Step(St.DONE)]
    assert walk(K.CREATE, Ev.BEGIN, Ev.SPAWN_FAILED)[-1] == Step(St.DONE)


def test_create_with_skip_launch_is_done_at_once() -> None:
    assert walk(K.CREATE, Ev.SKIP) == [Step(St.DONE)]


def test_start_cancels_a_pending_restart_then_spawns() -> None:
    assert walk(K.START, Ev.BEGIN)[0] == Step(St.SPAWNING, (A.CANCEL_RESTART, A.SPAWN))


def test_stop_signals_arms_the_timer_and_escalates() -> None:
    steps = walk(K.STOP, Ev.BEGIN, Ev.TIMEOUT, Ev.EXITED)
    assert steps == [
        Step(St.SIGNALLING, (A.SEND_SIGNAL, A.ARM_KILL_TIMER)),
        Step(St.KILLING, (A.SEND_KILL,)),
        Step(St.DONE),
    ]
    assert walk(K.STOP, Ev.BEGIN, Ev.EXITED)[-1] == Step(St.DONE)
    assert walk(K.STOP, Ev.IDLE) == [Step(St.DONE, (A.CANCEL_RESTART,))]


def test_restart_stops_then_spawns() -> None:
    steps = walk(K.RESTART, Ev.BEGIN, Ev.TIMEOUT, Ev.EXITED, Ev.SPAWNED)
    assert [s.next for s in steps] == [St.SIGNALLING, St.KILLING, St.SPAWNING, St.DONE]
    assert steps[2].actions == (A.SPAWN,)
    assert walk(K.RESTART, Ev.IDLE)[0] == Step(St.SPAWNING, (A.CANCEL_RESTART, A.SPAWN))


def test_signal_is_one_step() -> None:
    assert walk(K.SIGNAL, Ev.BEGIN) == [Step(St.DONE, (A.SEND_SIGNAL,))]


def test_destroy_idle_and_forced() -> None:
    assert walk(K.DESTROY, Ev.IDLE, Ev.CLEANED) == [
        Step(St.CLEANING, (A.CANCEL_RESTART, A.CLEANUP)),
        Step(St.DONE),
    ]
    assert walk(K.DESTROY, Ev.BEGIN, Ev.EXITED, Ev.CLEANED) == [
        Step(St.KILLING, (A.SEND_KILL,)),
        Step(St.CLEANING, (A.CLEANUP,)),
        Step(St.DONE),
    ]


@pytest.mark.parametrize(
    ("kind", "state", "actions"),
    [
        (K.CREATE, St.SPAWNING, (A.ADOPT_OR_SPAWN,)),
        (K.START, St.SPAWNING, (A.ADOPT_OR_SPAWN,)),
        (K.RESTART, St.SPAWNING, (A.ADOPT_OR_SPAWN,)),
        (K.STOP, St.SIGNALLING, (A.SEND_SIGNAL, A.ARM_KILL_TIMER)),
        (K.STOP, St.KILLING, (A.SEND_KILL,)),
        (K.RESTART, St.SIGNALLING, (A.SEND_SIGNAL, A.ARM_KILL_TIMER)),
        (K.RESTART, St.KILLING, (A.SEND_KILL,)),
        (K.DESTROY, St.KILLING, (A.SEND_KILL,)),
        (K.DESTROY, St.CLEANING, (A.CLEANUP,)),
    ],
)
def test_recover_resumes_from_the_last_step(
    kind: OpKind, state: OpState, actions: tuple[Action, ...]
) -> None:
    assert advance(kind, state, Ev.RECOVER) == Step(state, actions)


def test_every_waiting_state_can_be_recovered() -> None:
    for kind, table in TABLES.items():
        waiting = {step.next for step in table.values()} - {St.DONE}
        for state in waiting:
            assert (state, Ev.RECOVER) in table, f"{kind} cannot recover from {state}"


def test_every_operation_can_finish() -> None:
    for kind, table in TABLES.items():
        assert any(step.next is St.DONE for step in table.values()), kind


def test_stops_waiting_for_an_exit_can_be_aborted() -> None:
    for kind in (K.STOP, K.RESTART):
        for state in (St.SIGNALLING, St.KILLING):
            assert advance(kind, state, Ev.ABORT) == Step(St.DONE)


def test_done_takes_no_event() -> None:
    for kind in OpKind:
        for event in Event:
            with pytest.raises(IllegalTransition):
                advance(kind, St.DONE, event)


def test_an_illegal_step_names_the_operation() -> None:
    with pytest.raises(IllegalTransition) as info:
        advance(K.SIGNAL, St.NEW, Ev.SPAWNED)
    assert "signal" in info.value.message
    assert "spawned" in info.value.message
    assert info.value.details["op_state"] == "new"
