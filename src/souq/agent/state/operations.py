"""Operations as state machines. Pure.

Every command the agent runs on a machine (create, start, stop, restart, signal, destroy) is an
*operation* with its own small table ``(op state, event) -> (next op state, actions)``, over the
events the machine's life cycle takes too (:class:`souq.agent.state.events.Event`). The agent
appends each step to its op log (the ``ops`` table) *before* it runs the step's actions, so an
agent that crashed mid-operation finds the last step of every unfinished operation at start-up and
feeds it the ``recover`` event: the table then says what to do again. Actions are idempotent or
checked against the world (a spawn first tries to adopt a process that is already running).

::

    create   new ─begin─▶ spawning ─spawned | spawn_failed─▶ done
             (skip_launch: new ─skip─▶ done)
    start    new ─begin─▶ spawning ─spawned | spawn_failed─▶ done
    stop     new ─begin─▶ signalling ─exited─▶ done   (nothing runs: new ─idle─▶ done)
                          signalling ─timeout─▶ killing ─exited─▶ done
    restart  stop's steps, but ─exited─▶ spawning ─spawned─▶ done
             (nothing runs: new ─idle─▶ spawning)
    signal   new ─begin─▶ done
    destroy  new ─idle─▶ cleaning ─cleaned─▶ done
             (force, running) new ─begin─▶ killing ─exited─▶ cleaning ─cleaned─▶ done

``idle`` begins an operation on a machine with no process. A stop or restart still waiting for
its process to exit can be aborted (a forced destroy supersedes it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from souq.agent.state.events import Event
from souq.errors import IllegalTransition

__all__ = ["TABLES", "Action", "OpKind", "OpState", "Step", "advance"]


class OpKind(StrEnum):
    CREATE = "create"
    START = "start"
    STOP = "stop"
    RESTART = "restart"
    SIGNAL = "signal"
    DESTROY = "destroy"


class OpState(StrEnum):
    NEW = "new"
    DRAINING = "draining"  # out of the proxies' rotation, the process still serving
    SPAWNING = "spawning"
    SIGNALLING = "signalling"
    KILLING = "killing"
    CLEANING = "cleaning"
    DONE = "done"


class Action(StrEnum):
    SPAWN = "spawn"
    ADOPT_OR_SPAWN = "adopt_or_spawn"  # after a crash: the process may already be running
    SEND_SIGNAL = "send_signal"  # the operation's signal, to the process group
    ARM_KILL_TIMER = "arm_kill_timer"
    ARM_DRAIN_TIMER = "arm_drain_timer"  # the signal waits out the drain
    SEND_KILL = "send_kill"  # SIGKILL to the process group
    CANCEL_RESTART = "cancel_restart"  # a restart the supervisor has scheduled
    CLEANUP = "cleanup"  # the driver removes the machine's files


@dataclass(frozen=True)
class Step:
    next: OpState
    actions: tuple[Action, ...] = ()


St = OpState
Ev = Event
A = Action
_Table = dict[tuple[OpState, Event], Step]

_SPAWNING: _Table = {
    (St.SPAWNING, Ev.SPAWNED): Step(St.DONE),
    (St.SPAWNING, Ev.SPAWN_FAILED): Step(St.DONE),
    (St.SPAWNING, Ev.RECOVER): Step(St.SPAWNING, (A.ADOPT_OR_SPAWN,)),
    # A destroy while the spawn waits for the machine's image to be pulled.
    (St.SPAWNING, Ev.ABORT): Step(St.DONE),
}

_STOPPING: _Table = {
    (St.NEW, Ev.BEGIN): Step(St.SIGNALLING, (A.SEND_SIGNAL, A.ARM_KILL_TIMER)),
    # A machine that serves through the proxy: its `stopping` state takes it out of rotation,
    # and the signal follows once the drain is over (after a crash: at once).
    (St.NEW, Ev.DRAIN): Step(St.DRAINING, (A.ARM_DRAIN_TIMER,)),
    (St.DRAINING, Ev.DRAINED): Step(St.SIGNALLING, (A.SEND_SIGNAL, A.ARM_KILL_TIMER)),
    (St.DRAINING, Ev.RECOVER): Step(St.SIGNALLING, (A.SEND_SIGNAL, A.ARM_KILL_TIMER)),
    (St.DRAINING, Ev.ABORT): Step(St.DONE),
    (St.SIGNALLING, Ev.TIMEOUT): Step(St.KILLING, (A.SEND_KILL,)),
    # Unknown whether the signal went out before the crash: send it again, with a fresh timer.
    (St.SIGNALLING, Ev.RECOVER): Step(St.SIGNALLING, (A.SEND_SIGNAL, A.ARM_KILL_TIMER)),
    (St.KILLING, Ev.RECOVER): Step(St.KILLING, (A.SEND_KILL,)),
    (St.SIGNALLING, Ev.ABORT): Step(St.DONE),
    (St.KILLING, Ev.ABORT): Step(St.DONE),
}

TABLES: Final[Mapping[OpKind, Mapping[tuple[OpState, Event], Step]]] = MappingProxyType(
    {
        OpKind.CREATE: MappingProxyType(
            {
                (St.NEW, Ev.BEGIN): Step(St.SPAWNING, (A.SPAWN,)),
                (St.NEW, Ev.SKIP): Step(St.DONE),
                **_SPAWNING,
            }
        ),
        OpKind.START: MappingProxyType(
            {(St.NEW, Ev.BEGIN): Step(St.SPAWNING, (A.CANCEL_RESTART, A.SPAWN)), **_SPAWNING}
        ),
        OpKind.STOP: MappingProxyType(
            {
                **_STOPPING,
                (St.NEW, Ev.IDLE): Step(St.DONE, (A.CANCEL_RESTART,)),
                (St.DRAINING, Ev.EXITED): Step(St.DONE),
                (St.SIGNALLING, Ev.EXITED): Step(St.DONE),
                (St.KILLING, Ev.EXITED): Step(St.DONE),
            }
        ),
        OpKind.RESTART: MappingProxyType(
            {
                **_STOPPING,
                **_SPAWNING,
                (St.NEW, Ev.IDLE): Step(St.SPAWNING, (A.CANCEL_RESTART, A.SPAWN)),
                (St.DRAINING, Ev.EXITED): Step(St.SPAWNING, (A.SPAWN,)),
                (St.SIGNALLING, Ev.EXITED): Step(St.SPAWNING, (A.SPAWN,)),
                (St.KILLING, Ev.EXITED): Step(St.SPAWNING, (A.SPAWN,)),
            }
        ),
        # At most once: the step is logged as done before the signal goes out.
        OpKind.SIGNAL: MappingProxyType({(St.NEW, Ev.BEGIN): Step(St.DONE, (A.SEND_SIGNAL,))}),
        OpKind.DESTROY: MappingProxyType(
            {
                (St.NEW, Ev.IDLE): Step(St.CLEANING, (A.CANCEL_RESTART, A.CLEANUP)),
                (St.NEW, Ev.BEGIN): Step(St.KILLING, (A.SEND_KILL,)),
                # Graceful: out of rotation for the drain, the stop signal, SIGKILL after the
                # stop timeout; then the files. (A crash in between sends the signal again.)
                (St.NEW, Ev.DRAIN): Step(St.DRAINING, (A.ARM_DRAIN_TIMER,)),
                (St.DRAINING, Ev.DRAINED): Step(St.SIGNALLING, (A.SEND_SIGNAL, A.ARM_KILL_TIMER)),
                (St.DRAINING, Ev.RECOVER): Step(St.SIGNALLING, (A.SEND_SIGNAL, A.ARM_KILL_TIMER)),
                (St.SIGNALLING, Ev.TIMEOUT): Step(St.KILLING, (A.SEND_KILL,)),
                (St.SIGNALLING, Ev.RECOVER): Step(St.SIGNALLING, (A.SEND_SIGNAL, A.ARM_KILL_TIMER)),
                (St.DRAINING, Ev.EXITED): Step(St.CLEANING, (A.CLEANUP,)),
                (St.SIGNALLING, Ev.EXITED): Step(St.CLEANING, (A.CLEANUP,)),
                (St.KILLING, Ev.EXITED): Step(St.CLEANING, (A.CLEANUP,)),
                (St.KILLING, Ev.RECOVER): Step(St.KILLING, (A.SEND_KILL,)),
                (St.CLEANING, Ev.CLEANED): Step(St.DONE),
                (St.CLEANING, Ev.RECOVER): Step(St.CLEANING, (A.CLEANUP,)),
            }
        ),
    }
)


def advance(kind: OpKind, state: OpState, event: Event) -> Step:
    """The next step of an operation, or :class:`IllegalTransition` for a step the table lacks
    (a bug in the agent, never a user's mistake)."""
    try:
        return TABLES[kind][(state, event)]
    except KeyError:
        raise IllegalTransition(
            f"operation {kind} in state {state} cannot take the event {event}",
            hint="this is a bug in the agent; please report it",
            details={"op_kind": str(kind), "op_state": str(state), "op_event": str(event)},
        ) from None
