"""Launch events held back while this broker claims their machine.

A machine's launch event carries its whole record, and it often reaches the broker that made
the machine before the claim's answer is applied to the view (the answer is applied after the
create is answered, off its path). Applied first, the event's copy of the record would be
validated and written, and then the answer's copy again. So while a create of this broker is
under way (:meth:`LaunchHolds.hold`, by its request id), the events of the machine it makes
wait here; the broker releases them once the answer is applied (or the claim ended without
one), and the view applies them then: the record is not decoded again when the answer's copy is
as new. Nothing is lost: whatever the claim ends as, its release applies what was held.
"""

from __future__ import annotations

from souq.model.wire import MachineEventNote

__all__ = ["LaunchHolds"]

Run = list[MachineEventNote]  # events of one machine, oldest first


class LaunchHolds:
    def __init__(self) -> None:
        self._runs: dict[str, list[Run]] = {}  # request id -> the runs held for it
        self._machines: dict[str, str] = {}  # machine id -> the request id it waits for

    def __bool__(self) -> bool:
        return bool(self._runs)

    def hold(self, request_id: str) -> None:
        """A create of this broker is under way: hold the events of the machine it makes."""
        self._runs.setdefault(request_id, [])

    def take(self, run: Run) -> bool:
        """Keep ``run`` if its machine's create is held (its launch event names it, or an
        earlier one did); False: apply it now."""
        machine_id = run[0].machine_id
        request_id = self._machines.get(machine_id) or self._made_by(run)
        if request_id not in self._runs:
            return False
        self._machines[machine_id] = request_id
        self._runs[request_id].append(run)
        return True

    @staticmethod
    def _made_by(run: Run) -> str:
        carrier = next((m for m in run if m.carries_record), None)
        return "" if carrier is None else carrier.made_by()

    def release(self, request_id: str) -> list[Run]:
        """The create ended: what was held for it, in the order it came."""
        runs = self._runs.pop(request_id, [])
        for run in runs:
            self._machines.pop(run[0].machine_id, None)
        return runs
