"""What happens to a machine, named once. Pure.

One enum, :class:`Event`, is the input of both of the agent's tables: an operation's step
(:mod:`souq.agent.state.operations`, written to the op log) and the machine's transition
(:mod:`souq.agent.machines.lifecycle`). What the step records and publishes (the event's
``type``, Fly's vocabulary: :class:`souq.model.choices.EventType`) follows from it through one
table, :data:`PUBLISHED`::

    event           op log   life cycle   published
    begin, drain,   yes      -            -           how an operation goes on (a process
    drained, idle,                                    runs; it drains first; nothing runs; ...)
    skip, abort,
    recover
    timeout         yes      -            signal      the SIGKILL after a stop's timeout
    start           -        yes          start
    stop            -        yes          stop
    suspend         -        yes          suspend
    signal          -        yes          signal
    destroy,        -        yes          destroy
    force_destroy
    exited_restart  -        yes          exit        the restart policy starts it again
    spawned         yes      yes          start
    spawn_failed    yes      yes          fail
    exited          yes      yes          exit        the process ended; the machine stays down
    cleaned         yes      yes          destroy     its files are gone: it is destroyed

An event both tables take is one step of each, written in one transaction
(:meth:`souq.agent.machines.executor.Executor.apply`). A step publishes another type only
where the happening says more than its event: a restart's stop and start are ``restart``, a
preemption's stop is ``preempted``, a thaw is ``resume``.

The op log keeps the events' values, and shows them (``GET .../ops``): they do not change.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from souq.model.choices import EventType

__all__ = ["PUBLISHED", "Event"]


class Event(StrEnum):
    # an operation's own steps
    BEGIN = "begin"
    DRAIN = "drain"  # begin, but let the proxies stop routing to it first
    DRAINED = "drained"  # the drain's time is up: the signal goes out
    IDLE = "idle"  # begin, but the machine has no process
    SKIP = "skip"  # create with skip_launch
    TIMEOUT = "timeout"  # the stop timeout passed and the process still runs
    ABORT = "abort"
    RECOVER = "recover"  # the agent restarted with this operation unfinished
    # what a user (or the agent, for a user) asks of the machine
    START = "start"
    STOP = "stop"
    SUSPEND = "suspend"
    SIGNAL = "signal"
    DESTROY = "destroy"
    FORCE_DESTROY = "force_destroy"  # a running machine: killed first
    # what the agent sees happen
    SPAWNED = "spawned"
    SPAWN_FAILED = "spawn_failed"
    EXITED = "exited"  # the process ended, and the machine stays down
    EXITED_RESTART = "exited_restart"  # the process ended, and its restart policy restarts it
    CLEANED = "cleaned"  # its files are gone: it is destroyed


PUBLISHED: Final[Mapping[Event, EventType]] = MappingProxyType(
    {
        Event.TIMEOUT: EventType.SIGNAL,
        Event.START: EventType.START,
        Event.STOP: EventType.STOP,
        Event.SUSPEND: EventType.SUSPEND,
        Event.SIGNAL: EventType.SIGNAL,
        Event.DESTROY: EventType.DESTROY,
        Event.FORCE_DESTROY: EventType.DESTROY,
        Event.SPAWNED: EventType.START,
        Event.SPAWN_FAILED: EventType.FAIL,
        Event.EXITED: EventType.EXIT,
        Event.EXITED_RESTART: EventType.EXIT,
        Event.CLEANED: EventType.DESTROY,
    }
)
