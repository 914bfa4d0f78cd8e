"""A machine displaced for another (:mod:`souq.agent.machines.evictions` chooses which, at a
claim): its event ``preempted``, its reservation given back and, if it runs, its stop; and,
after an agent restart, the displacements a claim named but did not write (:func:`finish`).
It stands on the executor's steps only (:class:`~souq.agent.machines.steps.Steps`), so that the
executor's recovery can finish a claim's evictions without importing the executor back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from souq.agent.machines import lifecycle
from souq.agent.state.events import Event
from souq.agent.state.operations import OpKind
from souq.agent.state.records import MachineRow
from souq.market.preemption import JOB_VICTIM
from souq.model.choices import EventType
from souq.model.machine import MachineState

if TYPE_CHECKING:
    from souq.agent.machines.steps import Steps

__all__ = ["DISPLACEABLE", "RUNNING", "displace", "finish"]

S = MachineState
DISPLACEABLE = (S.STARTED, S.SUSPENDED, S.STOPPED, S.CREATED)
RUNNING = (S.STARTED, S.SUSPENDED)


def finish(ex: Steps, machine_id: str) -> None:
    """After an agent restart, before the create of ``machine_id`` resumes: the victims its
    claim named that still hold their room (the agent died between the new machine's record
    and theirs) are displaced now, as the claim would have; a batch job's run went with the
    agent."""
    row = ex.row_by_id(machine_id)
    for victim in row.placement.preempted if row.placement is not None else ():
        if victim.machine_id.startswith(JOB_VICTIM) or not ex.has(victim.machine_id):
            continue
        left = ex.row_by_id(victim.machine_id)
        if (
            left.state in DISPLACEABLE
            and left.id not in ex.unreserved
            and ex.current_op(left.id) is None
        ):
            message = f"preempted by machine {row.id} of app {row.app}: {victim.reason}"
            displace(ex, left, message, durable=True)


def displace(ex: Steps, row: MachineRow, message: str, *, durable: bool = False) -> None:
    """Preempt ``row``: an event ``preempted`` saying ``message``, its reservation given back,
    and, if it runs, its stop. ``durable=False``: the caller syncs the store (a claim's)."""
    if row.state is S.STOPPED:
        ex.apply(
            row.id,
            type=EventType.PREEMPTED,
            source="agent",
            message=message,
            give_back=True,
            durable=durable,
        )
        return
    lifecycle.transition(row.state, Event.STOP, machine_id=row.id)
    running = row.state in RUNNING
    stop = row.config.stop_config
    drain = stop.drain_s if running and row.config.services and row.state is S.STARTED else 0.0
    op = ex.new_op(
        OpKind.STOP,
        row.id,
        source="agent",
        signal=stop.signal,
        timeout_s=stop.timeout_s,
        drain_s=drain,
    )
    ex.step(
        op,
        (Event.DRAIN if drain else Event.BEGIN) if running else Event.IDLE,
        event=Event.STOP,
        type=EventType.PREEMPTED,
        source="agent",
        signal=stop.signal if running else None,
        message=message,
        give_back=True,
        durable=durable,  # a claim's: the new machine's record syncs it, before its answer
    )
