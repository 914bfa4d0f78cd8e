"""The machine state table: every legal transition, and illegal ones explained."""

from __future__ import annotations

import itertools

import pytest

from souq.agent.machines.lifecycle import TRANSITIONS, legal_events, transition
from souq.agent.state.events import Event
from souq.errors import IllegalTransition
from souq.model import MachineState

S = MachineState
E = Event

LEGAL = [
    (S.CREATED, E.START, S.STARTING),
    (S.CREATED, E.STOP, S.STOPPED),
    (S.CREATED, E.DESTROY, S.DESTROYING),
    (S.CREATED, E.FORCE_DESTROY, S.DESTROYING),
    (S.STARTING, E.START, S.STARTING),
    (S.STARTING, E.SPAWNED, S.STARTED),
    (S.STARTING, E.SPAWN_FAILED, S.FAILED),
    (S.STARTING, E.STOP, S.STOPPED),
    (S.STARTING, E.DESTROY, S.DESTROYING),
    (S.STARTING, E.FORCE_DESTROY, S.DESTROYING),
    (S.STARTED, E.STOP, S.STOPPING),
    (S.STARTED, E.SIGNAL, S.STARTED),
    (S.STARTED, E.EXITED, S.STOPPED),
    (S.STARTED, E.EXITED_RESTART, S.STARTING),
    (S.STARTED, E.FORCE_DESTROY, S.DESTROYING),
    (S.STARTED, E.SUSPEND, S.SUSPENDED),
    (S.SUSPENDED, E.START, S.STARTED),
    (S.SUSPENDED, E.SUSPEND, S.SUSPENDED),
    (S.SUSPENDED, E.STOP, S.STOPPING),
    (S.SUSPENDED, E.EXITED, S.STOPPED),
    (S.SUSPENDED, E.EXITED_RESTART, S.STARTING),
    (S.SUSPENDED, E.FORCE_DESTROY, S.DESTROYING),
    (S.STOPPING, E.STOP, S.STOPPING),
    (S.STOPPING, E.SIGNAL, S.STOPPING),
    (S.STOPPING, E.EXITED, S.STOPPED),
    (S.STOPPING, E.FORCE_DESTROY, S.DESTROYING),
    (S.STOPPED, E.START, S.STARTING),
    (S.STOPPED, E.STOP, S.STOPPED),
    (S.STOPPED, E.DESTROY, S.DESTROYING),
    (S.STOPPED, E.FORCE_DESTROY, S.DESTROYING),
    (S.FAILED, E.START, S.STARTING),
    (S.FAILED, E.STOP, S.STOPPED),
    (S.FAILED, E.DESTROY, S.DESTROYING),
    (S.FAILED, E.FORCE_DESTROY, S.DESTROYING),
    (S.DESTROYING, E.DESTROY, S.DESTROYING),
    (S.DESTROYING, E.FORCE_DESTROY, S.DESTROYING),
    (S.DESTROYING, E.EXITED, S.DESTROYING),
    (S.DESTROYING, E.CLEANED, S.DESTROYED),
]


@pytest.mark.parametrize(("state", "event", "after"), LEGAL)
def test_legal_transitions(state: MachineState, event: Event, after: MachineState) -> None:
    assert transition(state, event) is after


def test_the_table_is_exactly_the_legal_list() -> None:
    assert {(s, e): a for s, e, a in LEGAL} == dict(TRANSITIONS)


ILLEGAL = sorted(
    set(itertools.product(MachineState, Event)) - set(TRANSITIONS),
    key=lambda pair: (pair[0].value, pair[1].value),
)


@pytest.mark.parametrize(("state", "event"), ILLEGAL)
def test_everything_else_is_illegal(state: MachineState, event: Event) -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(state, event, machine_id="m1")
    err = info.value
    assert "m1" in err.message
    assert str(state) in err.message
    assert err.hint
    assert err.details == {"state": str(state), "event": str(event)}
    assert err.http_status == 409


def test_destroyed_is_final() -> None:
    assert legal_events(S.DESTROYED) == []
    with pytest.raises(IllegalTransition) as info:
        transition(S.DESTROYED, E.START, machine_id="1234")
    assert info.value.message == "machine 1234 is destroyed; it cannot be started"
    assert "create a new machine" in (info.value.hint or "")


def test_destroying_a_running_machine_needs_force() -> None:
    for state in (S.STARTED, S.STOPPING):
        with pytest.raises(IllegalTransition) as info:
            transition(state, E.DESTROY, machine_id="m")
        assert "force" in (info.value.hint or "")
        assert transition(state, E.FORCE_DESTROY) is S.DESTROYING


def test_starting_a_started_machine_suggests_restart() -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(S.STARTED, E.START)
    assert "restart" in (info.value.hint or "")


def test_internal_events_read_as_such() -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(S.STOPPED, E.SPAWNED, machine_id="m")
    assert "cannot apply spawned" in info.value.message


def test_every_state_but_destroyed_can_be_left() -> None:
    for state in MachineState:
        assert bool(legal_events(state)) is (state is not S.DESTROYED)
