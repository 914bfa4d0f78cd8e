"""``souq machine run`` waits for what it ran: the machine ``started`` (or already done), or
why it could not be, as a Fly user expects of ``fly machine run``."""

from __future__ import annotations

from souq.client.api import SouqClient
from souq.errors import MachineFailed
from souq.model import Machine, MachineState
from souq.model.choices import EventType

__all__ = ["until_started"]

S = MachineState
_SETTLED = (S.STARTED, S.STOPPED, S.FAILED, S.DESTROYED)  # (stopped: it ran, and is done)


def until_started(client: SouqClient, machine: Machine, *, timeout: float) -> Machine:
    """The machine once it has started (or ran and stopped); :class:`MachineFailed` with the
    reason if it could not be started, :class:`~souq.errors.WaitTimeout` after ``timeout``."""
    if machine.state not in _SETTLED:
        machine = client.wait(machine.app, machine.id, _SETTLED, timeout=timeout)
    if machine.state is S.FAILED:
        fails = (e.message for e in machine.events if e.type == EventType.FAIL and e.message)
        why = next(fails, None)
        raise MachineFailed(
            f"machine {machine.id} could not be started: {why or 'no reason recorded'}",
            hint=f"fix its command or image (`souq machine update`), or destroy it "
            f"(`souq machine destroy --app {machine.app} {machine.id}`); a failed machine "
            "holds no capacity",
            details={"machine_id": machine.id, "app": machine.app, "state": str(machine.state)},
        )
    return machine
