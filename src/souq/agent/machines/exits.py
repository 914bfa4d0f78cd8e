"""What the supervisor reports to the executor: a machine's exit, a kill timer due, a restart
timer due, and the exit of a process that died while no agent watched it.

An exit an operation waits for (a stop, a restart, a forced destroy: :data:`WAITING_FOR_EXIT`)
advances that operation; any other goes through the restart policy (restart after its backoff, stay
down, or, with ``auto_destroy``, be destroyed). A kill timer ends a stop's drain, or sends SIGKILL
to a machine still running past its stop's timeout; a restart timer begins the restart. Each is a
step of :meth:`souq.agent.machines.executor.Executor.step` (transition, event and op step in one
transaction), so they are recorded as any command's are.
"""

from __future__ import annotations

import logging

from souq.agent.machines.steps import Steps, begin_destroy
from souq.agent.state.events import Event
from souq.agent.state.operations import OpKind, OpState
from souq.agent.state.records import Op
from souq.drivers.base import Driver, ExitStatus, records_exits
from souq.model.choices import EventType
from souq.model.machine import MachineState

__all__ = [
    "WAITING_FOR_EXIT",
    "exited_during_op",
    "last_exit",
    "on_exit",
    "on_kill_due",
    "on_restart_due",
]

log = logging.getLogger(__name__)

S = MachineState
WAITING_FOR_EXIT = (OpState.DRAINING, OpState.SIGNALLING, OpState.KILLING)
_RUNNING = (S.STARTED, S.STOPPING, S.SUSPENDED)


def on_exit(ex: Steps, machine_id: str, status: ExitStatus) -> None:
    """The machine's process exited with ``status``."""
    ran_for = ex.process_gone(machine_id)
    if not ex.has(machine_id):
        return
    row = ex.row_by_id(machine_id)
    op = ex.current_op(machine_id)
    if op is not None and op.state in WAITING_FOR_EXIT:
        exited_during_op(ex, op, status)
        return
    if row.state not in _RUNNING:
        log.warning("machine %s exited while %s", machine_id, row.state)
        ex.apply(machine_id, type=EventType.EXIT, status=status)
        return
    decision = ex.supervisor.decide(
        row.config.restart,
        status,
        restarts=row.restarts,
        ran_for_s=ran_for,
        user_stop=row.state is S.STOPPING,
    )
    ex.apply(
        machine_id,
        event=Event.EXITED_RESTART if decision.restart else Event.EXITED,
        status=status,
        message=f"{status.describe()}; {decision.reason}",
        restarts=decision.restarts,
    )
    if decision.restart:
        ex.supervisor.schedule_restart(machine_id, decision.delay_s)
    elif row.config.auto_destroy:
        begin_destroy(
            ex,
            machine_id,
            Event.IDLE,
            Event.DESTROY,
            source="agent",
            message="auto_destroy: it exited and its restart policy keeps it down",
        )


def exited_during_op(ex: Steps, op: Op, status: ExitStatus) -> None:
    """The exit ``op`` waited for: the operation advances."""
    ex.drop_handle(op.machine_id)
    ex.step(op, Event.EXITED, status=status)


def on_kill_due(ex: Steps, machine_id: str) -> None:
    """A stop's timer: its drain is over, or the machine outlived its stop's timeout."""
    op = ex.current_op(machine_id)
    if op is not None and op.state is OpState.DRAINING:
        ex.step(op, Event.DRAINED)
        return
    if op is None or op.state is not OpState.SIGNALLING:
        return
    ex.step(
        op,
        Event.TIMEOUT,
        signal="SIGKILL",
        message=f"still running {op.params['timeout_s']:g}s after {op.params['signal']}",
    )


def on_restart_due(ex: Steps, machine_id: str) -> None:
    """A restart's backoff is over: the restart begins, unless something else came first."""
    if not ex.has(machine_id) or ex.current_op(machine_id) is not None:
        return
    if ex.row_by_id(machine_id).state is not S.STARTING:
        return
    op = ex.new_op(OpKind.START, machine_id, source="agent", type=EventType.RESTART)
    ex.step(op, Event.BEGIN)


def last_exit(driver: Driver, machine_id: str) -> ExitStatus:
    """How a process that died while no agent watched it ended, if the driver kept it."""
    if records_exits(driver):
        return driver.last_exit(machine_id)
    return ExitStatus()
