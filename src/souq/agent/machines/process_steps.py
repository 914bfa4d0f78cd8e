"""What the executor does to a machine's process itself: freeze and thaw it (suspend, resume),
send it a signal, and clean up after it (its sandbox, its private address, its volume's
attachment). Part of :class:`~souq.agent.machines.executor.Executor`, whose state it uses (as
:class:`~souq.agent.machines.steps.Steps` where it hands itself on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from souq.agent.machines import exits, lifecycle
from souq.agent.state.events import Event
from souq.agent.state.records import MachineRow, Op, Source
from souq.agent.volumes.worker_volumes import AgentVolumes
from souq.drivers.base import Driver, Handle
from souq.errors import IllegalTransition
from souq.model.choices import EventType
from souq.model.machine import MachineState
from souq.network.addresses import private_address
from souq.network.links import WorkerNetwork

if TYPE_CHECKING:
    from souq.agent.machines.steps import Steps

__all__ = ["ProcessSteps"]

S = MachineState


class ProcessSteps:
    driver: Driver
    network: WorkerNetwork | None
    volumes: AgentVolumes | None
    _rows: dict[str, MachineRow]
    _handles: dict[str, Handle]
    _frozen: set[str]
    _ran_since: dict[str, float]

    def apply(self, machine_id: str, **changes: Any) -> Any: ...  # the executor's

    def step(self, op: Op, op_event: Event, **apply_args: Any) -> None: ...  # the executor's

    def freeze(self, machine_id: str, *, frozen: bool, source: Source) -> None:
        """Suspend a started machine (its processes frozen where they stand: memory, sockets
        and port kept) or resume a suspended one; one step, recorded as ``suspend`` or
        ``resume``. :class:`IllegalTransition` from any other state."""
        row = self._rows[machine_id]
        event = Event.SUSPEND if frozen else Event.START
        lifecycle.transition(row.state, event, machine_id=row.id)
        if frozen and row.state is S.SUSPENDED:
            return  # suspended already
        handle = self._handles.get(machine_id)
        if handle is None or not self.driver.freeze(handle, frozen):
            raise IllegalTransition(
                f"machine {machine_id} has no running process to "
                f"{'suspend' if frozen else 'resume'}",
                hint="its exit is being recorded; start it again once it is stopped",
            )
        if frozen:
            self._frozen.add(machine_id)
        else:
            self._frozen.discard(machine_id)
        # (published as suspend, or as resume: a start of the same process)
        self.apply(
            machine_id, event=event, type=None if frozen else EventType.RESUME, source=source
        )

    def _thaw(self, machine_id: str, handle: Handle) -> None:
        """A frozen machine must run again to take a signal (a stop, a kill)."""
        if machine_id in self._frozen:
            self._frozen.discard(machine_id)
            self.driver.freeze(handle, False)

    def _send(self, op: Op, sig: int) -> None:
        handle = self._handles.get(op.machine_id)
        if handle is not None:
            self._thaw(op.machine_id, handle)
        if handle is None:
            if op.state in exits.WAITING_FOR_EXIT:
                # Nothing runs (it died while no agent watched): the operation sees the exit now.
                exits.exited_during_op(
                    cast("Steps", self), op, exits.last_exit(self.driver, op.machine_id)
                )
            return
        self.driver.signal(handle, sig)  # False: it is exiting, and its watcher will report

    def _cleanup(self, op: Op) -> None:
        self.driver.destroy(op.machine_id)
        address = self._rows[op.machine_id].address
        if self.network is not None and address is not None and address.private_ip:
            self.network.remove(op.machine_id, private_address(address))
        self._ran_since.pop(op.machine_id, None)
        self.step(op, Event.CLEANED, pid=None, pid_start_time=None)
        if self.volumes is not None:  # its volume stays, free for the next machine
            self.volumes.detach(op.machine_id)
