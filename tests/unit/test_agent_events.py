"""One name per happening: the event enum both of the agent's tables take, and what each
event is published as."""

from __future__ import annotations

from souq.agent.machines.lifecycle import EVENTS, TRANSITIONS
from souq.agent.state.events import PUBLISHED, Event
from souq.agent.state.operations import TABLES, OpKind, OpState
from souq.agent.state.schema import op_step_of
from souq.model.choices import RUN_STARTS, EventType

OP_EVENTS = {event for table in TABLES.values() for _, event in table}


def test_every_event_is_taken_by_a_table() -> None:
    assert set(Event) == OP_EVENTS | EVENTS
    assert {event for _, event in TRANSITIONS} == EVENTS


def test_the_events_both_tables_take() -> None:
    assert {
        Event.SPAWNED,
        Event.SPAWN_FAILED,
        Event.EXITED,
        Event.CLEANED,
    } == OP_EVENTS & EVENTS


def test_every_life_cycle_event_is_published() -> None:
    assert set(PUBLISHED) >= EVENTS
    # an operation's own steps are not, but for the SIGKILL after a stop's timeout
    assert set(PUBLISHED) - EVENTS == {Event.TIMEOUT}
    assert PUBLISHED[Event.TIMEOUT] is EventType.SIGNAL


def test_published_as_fly_names_them() -> None:
    assert {event: str(PUBLISHED[event]) for event in PUBLISHED} == {
        Event.TIMEOUT: "signal",
        Event.START: "start",
        Event.STOP: "stop",
        Event.SUSPEND: "suspend",
        Event.SIGNAL: "signal",
        Event.DESTROY: "destroy",
        Event.FORCE_DESTROY: "destroy",
        Event.SPAWNED: "start",
        Event.SPAWN_FAILED: "fail",
        Event.EXITED: "exit",
        Event.EXITED_RESTART: "exit",
        Event.CLEANED: "destroy",
    }


def test_the_published_types_are_the_users_strings() -> None:
    assert [str(t) for t in EventType] == [
        "launch",
        "standby",
        "start",
        "stop",
        "restart",
        "suspend",
        "resume",
        "signal",
        "exit",
        "fail",
        "pull",
        "update",
        "metadata",
        "cordon",
        "uncordon",
        "preempt_notice",
        "preempted",
        "destroy",
    ]
    assert [str(t) for t in RUN_STARTS] == ["launch", "start", "restart"]


def test_the_op_log_keeps_its_values() -> None:
    # What an older agent wrote reads, and what `GET .../ops` shows does not change.
    assert {e.value for e in OP_EVENTS} == {
        "begin",
        "drain",
        "drained",
        "idle",
        "skip",
        "spawned",
        "spawn_failed",
        "timeout",
        "exited",
        "cleaned",
        "abort",
        "recover",
    }
    step = op_step_of(("op-1", "m1", "destroy", "done", "cleaned", 7, None))
    assert (step.kind, step.state, step.event) == (OpKind.DESTROY, OpState.DONE, Event.CLEANED)
