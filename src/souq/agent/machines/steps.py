"""What the executor's parts call it by: the exit handlers (:mod:`souq.agent.machines.exits`),
recovery after a restart (:mod:`souq.agent.machines.recovery`) and the process steps
(:mod:`souq.agent.machines.process_steps`) take a :class:`Steps`, which
:class:`souq.agent.machines.executor.Executor` is, so that none of them imports the executor and the
executor imports each of them (no circle). :func:`begin_destroy` is a destroy's start, made of
two of those primitives, for the commands and the exit handlers alike."""

from __future__ import annotations

from typing import Any, Protocol, Unpack

from souq.agent.machines.checks import MachineChecks
from souq.agent.machines.supervisor import Supervisor
from souq.agent.state.events import Event
from souq.agent.state.operations import Action, OpKind
from souq.agent.state.records import MachineRow, Op, OpParams, OpStep, Source, StopParams
from souq.agent.state.store import Store
from souq.drivers.base import Driver, Handle

__all__ = ["Steps", "begin_destroy"]


class Steps(Protocol):
    """The executor's state and its one step primitive, as its parts see them."""

    @property
    def store(self) -> Store: ...
    @property
    def driver(self) -> Driver: ...
    @property
    def supervisor(self) -> Supervisor: ...
    @property
    def checks(self) -> MachineChecks: ...

    # the machines and their operations
    unreserved: set[str]  # machines that hold no reservation (failed, displaced)

    def has(self, machine_id: str) -> bool: ...
    def row_by_id(self, machine_id: str) -> MachineRow: ...
    def rows(self) -> list[MachineRow]: ...
    def current_op(self, machine_id: str) -> Op | None: ...
    def new_op(self, kind: OpKind, machine_id: str, **params: Unpack[OpParams]) -> Op: ...

    # a step: the transition, its event and the op step in one transaction, then its actions
    def apply(self, machine_id: str, **args: Any) -> tuple[Action, ...]: ...
    def step(self, op: Op, op_event: Event, **apply_args: Any) -> None: ...
    def resume(self, last: OpStep) -> None: ...

    # the machines' processes
    def handle(self, machine_id: str) -> Handle | None: ...
    def adopt(self, machine_id: str, handle: Handle) -> None: ...
    def drop_handle(self, machine_id: str) -> None: ...
    def process_gone(self, machine_id: str) -> float: ...
    def exited_unwatched(self, machine_id: str) -> None: ...


def begin_destroy(
    ex: Steps,
    machine_id: str,
    first: Event,
    event: Event,
    *,
    source: Source,
    message: str | None = None,
    **params: Unpack[StopParams],
) -> Op:
    """A destroy of the machine by ``source``: its operation (with ``params``, e.g. the stop's
    signal and times of a graceful one) and its first step, ``first`` on ``event``."""
    op = ex.new_op(OpKind.DESTROY, machine_id, source=source, **params)
    ex.step(op, first, event=event, source=source, message=message)
    return op
