"""After an agent restart: the machines' processes re-adopted, unfinished operations resumed
from their last logged step (an unfinished create first displaces the victims its claim named
and could not displace before the agent died: :func:`souq.agent.machines.displacing.finish`), and
the exits of processes that died while no agent watched reported (then the restart policy
applies to them as to any exit)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from souq.agent.machines import displacing
from souq.agent.state.events import Event
from souq.agent.state.operations import OpKind
from souq.agent.state.records import MachineRow
from souq.drivers.base import Handle
from souq.model.machine import MachineState

if TYPE_CHECKING:
    from souq.agent.machines.steps import Steps

__all__ = ["recover"]

log = logging.getLogger(__name__)

S = MachineState
_RUNNING = (S.STARTED, S.STOPPING, S.SUSPENDED)


def recover(ex: Steps) -> None:
    pending = ex.store.unfinished_ops()
    with_ops = {s.machine_id for s in pending}
    for row in ex.rows():
        handle = _last_handle(ex, row, row.id in with_ops)
        if handle is not None and ex.driver.recover(handle):
            log.info("re-adopted machine %s (pid %d)", row.id, handle.pid)
            ex.adopt(row.id, handle)
    for last in pending:
        if ex.has(last.machine_id) and ex.current_op(last.machine_id) is None:
            if last.kind is OpKind.CREATE:
                displacing.finish(ex, last.machine_id)
            ex.resume(last)
    for row in ex.rows():
        if ex.current_op(row.id) is not None or ex.handle(row.id) is not None:
            continue
        if row.state in _RUNNING:
            ex.exited_unwatched(row.id)
        elif row.state is S.STARTING:  # it was waiting out a restart backoff
            ex.supervisor.schedule_restart(row.id, 0.0)
        elif row.state is S.DESTROYING:
            op = ex.new_op(OpKind.DESTROY, row.id, source="agent")
            # (its destroy was published before the agent's restart)
            ex.step(op, Event.IDLE, event=Event.DESTROY, published=False)
    for row in ex.rows():
        ex.checks.follow(row)  # the re-adopted machines' health checks run again


def _last_handle(ex: Steps, row: MachineRow, has_op: bool) -> Handle | None:
    if row.state is S.DESTROYED:
        return None
    if row.pid is not None and row.pid_start_time is not None:
        return Handle(row.id, row.pid, row.pid_start_time)
    if has_op or row.state in (S.STARTING, *_RUNNING, S.DESTROYING):
        return ex.driver.find(row.id)  # started, but the agent died before recording it
    return None
