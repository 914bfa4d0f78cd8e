"""The machine life cycle: one table of legal transitions. Pure.

States follow Fly's Machines API (:class:`souq.model.MachineState`). Events
(:class:`souq.agent.state.events.Event`, which the op log takes too) are what happens to a
machine: a user asks (``start``, ``stop``, ``suspend``, ``signal``, ``destroy``,
``force_destroy``) or the agent observes (``spawned``, ``spawn_failed``, ``exited``,
``exited_restart``, ``cleaned``)::

    created ──start──▶ starting ──spawned──▶ started ──stop──▶ stopping ──exited──▶ stopped
                        │   ▲                  │                                     │
           spawn_failed │   └─exited_restart───┤ (the restart policy says restart)  │
                        ▼                      └──exited──▶ stopped ──start──▶ starting
                      failed ──start──▶ starting
    started ──suspend──▶ suspended ──start──▶ started   (frozen, then thawed: the same process)
                           └──stop──▶ stopping (thawed, then signalled)
    any state but destroyed ──destroy──▶ destroying ──cleaned──▶ destroyed
    (a running machine needs force_destroy: it is killed first)

Anything not in the table raises :class:`souq.errors.IllegalTransition` naming the machine, its
state and the event, with a hint saying what to do instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from souq.agent.state.events import Event
from souq.errors import IllegalTransition
from souq.model.machine import MachineState

__all__ = ["EVENTS", "TRANSITIONS", "legal_events", "transition"]


S = MachineState
E = Event

TRANSITIONS: Final[Mapping[tuple[MachineState, Event], MachineState]] = MappingProxyType(
    {
        (S.CREATED, E.START): S.STARTING,
        (S.CREATED, E.STOP): S.STOPPED,  # nothing runs: it is simply stopped
        (S.CREATED, E.DESTROY): S.DESTROYING,
        (S.CREATED, E.FORCE_DESTROY): S.DESTROYING,
        # `starting` without a process is a restart waiting for its backoff.
        (S.STARTING, E.START): S.STARTING,  # a user start skips the backoff
        (S.STARTING, E.SPAWNED): S.STARTED,
        (S.STARTING, E.SPAWN_FAILED): S.FAILED,
        (S.STARTING, E.STOP): S.STOPPED,  # cancels the pending restart
        (S.STARTING, E.DESTROY): S.DESTROYING,
        (S.STARTING, E.FORCE_DESTROY): S.DESTROYING,
        (S.STARTED, E.STOP): S.STOPPING,
        (S.STARTED, E.SIGNAL): S.STARTED,
        (S.STARTED, E.EXITED): S.STOPPED,
        (S.STARTED, E.EXITED_RESTART): S.STARTING,
        (S.STARTED, E.FORCE_DESTROY): S.DESTROYING,
        (S.STARTED, E.SUSPEND): S.SUSPENDED,
        # Suspended: the process is frozen (it keeps its memory and its port). A start thaws
        # it; a stop thaws it and sends the stop signal; it can still die (killed, or OOM).
        (S.SUSPENDED, E.START): S.STARTED,
        (S.SUSPENDED, E.SUSPEND): S.SUSPENDED,
        (S.SUSPENDED, E.STOP): S.STOPPING,
        (S.SUSPENDED, E.EXITED): S.STOPPED,
        (S.SUSPENDED, E.EXITED_RESTART): S.STARTING,
        (S.SUSPENDED, E.FORCE_DESTROY): S.DESTROYING,
        (S.STOPPING, E.STOP): S.STOPPING,
        (S.STOPPING, E.SIGNAL): S.STOPPING,
        (S.STOPPING, E.EXITED): S.STOPPED,  # a user stop never restarts
        (S.STOPPING, E.FORCE_DESTROY): S.DESTROYING,
        (S.STOPPED, E.START): S.STARTING,
        (S.STOPPED, E.STOP): S.STOPPED,
        (S.STOPPED, E.DESTROY): S.DESTROYING,
        (S.STOPPED, E.FORCE_DESTROY): S.DESTROYING,
        (S.FAILED, E.START): S.STARTING,
        (S.FAILED, E.STOP): S.STOPPED,
        (S.FAILED, E.DESTROY): S.DESTROYING,
        (S.FAILED, E.FORCE_DESTROY): S.DESTROYING,
        (S.DESTROYING, E.DESTROY): S.DESTROYING,
        (S.DESTROYING, E.FORCE_DESTROY): S.DESTROYING,
        (S.DESTROYING, E.EXITED): S.DESTROYING,  # the kill of a forced destroy landed
        (S.DESTROYING, E.CLEANED): S.DESTROYED,
    }
)

# The events the table takes (the others are an operation's own: souq.agent.state.events).
EVENTS: Final[frozenset[Event]] = frozenset(event for _, event in TRANSITIONS)

# How a user-facing event reads in "it cannot be ...".
_PARTICIPLE = {
    E.START: "started",
    E.STOP: "stopped",
    E.SUSPEND: "suspended",
    E.SIGNAL: "signalled",
    E.DESTROY: "destroyed",
    E.FORCE_DESTROY: "destroyed",
}


def legal_events(state: MachineState) -> list[Event]:
    """The events the table accepts in ``state``, in table order."""
    return [event for (s, event) in TRANSITIONS if s is state]


def transition(state: MachineState, event: Event, *, machine_id: str = "") -> MachineState:
    """The state after ``event``, or :class:`IllegalTransition` when the table has no entry."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise _illegal(state, event, machine_id) from None


def _illegal(state: MachineState, event: Event, machine_id: str) -> IllegalTransition:
    who = f"machine {machine_id}" if machine_id else "the machine"
    if event in _PARTICIPLE:
        message = f"{who} is {state}; it cannot be {_PARTICIPLE[event]}"
    else:
        message = f"{who} is {state}; the agent cannot apply {event} to it"
    return IllegalTransition(
        message,
        hint=_hint(state, event),
        details={"state": str(state), "event": str(event)},
    )


_HINTS: Mapping[tuple[MachineState | None, Event | None], str] = {
    (S.DESTROYED, None): "it is gone; create a new machine",
    (S.DESTROYING, None): "it is being destroyed",
    (S.STARTED, E.DESTROY): "stop it first, or destroy it with force",
    (S.STOPPING, E.DESTROY): "stop it first, or destroy it with force",
    (S.SUSPENDED, E.DESTROY): "stop it first, or destroy it with force",
    (None, E.SUSPEND): "only a started machine can be suspended",
    (S.STARTED, E.START): "it is already running; use restart to run it afresh",
    (S.STOPPING, E.START): "wait until it is stopped, then start it",
    (None, E.SIGNAL): "only a running machine can be signalled; start it first",
}


def _hint(state: MachineState, event: Event) -> str:
    for key in ((state, event), (state, None), (None, event)):
        if key in _HINTS:
            return _HINTS[key]
    legal = ", ".join(str(e) for e in legal_events(state)) or "none"
    return f"events allowed while {state}: {legal}"
