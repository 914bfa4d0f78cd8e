"""Which machine events the broker's event log has told, so that each is told once.

A machine event can reach the view twice: live on ``souq.evt.>`` and again in the machine's
record when anti-entropy re-lists its worker (after an outage, events held by an agent may come
after the re-list, or never reach this broker at all). The log takes an event only the first
time; a re-listed record's events that the log never had (:meth:`SeenEvents.missed`) are the
ones an outage swallowed, and are told then.

An event is known by ``(machine id, timestamp, type, status)``. The memory is bounded: the
*horizon* is the newest timestamp forgotten (at first, when the broker started); a re-listed
record's events at or before it are never told, so a forgotten event cannot come back as new.
"""

from __future__ import annotations

from collections import OrderedDict

from souq.model import Machine, MachineEvent

__all__ = ["SeenEvents"]

_Key = tuple[str, int, str, str]


def _key(machine_id: str, event: MachineEvent) -> _Key:
    return (machine_id, event.timestamp, event.type, event.status.value)


class SeenEvents:
    def __init__(self, capacity: int, *, horizon_ms: int) -> None:
        self._keys: OrderedDict[_Key, None] = OrderedDict()
        self._capacity = max(1, capacity)
        self.horizon_ms = horizon_ms

    def first_time(self, machine_id: str, event: MachineEvent) -> bool:
        """Remember the event; True unless it is remembered as told already."""
        key = _key(machine_id, event)
        if key in self._keys:
            return False
        self._keys[key] = None
        if len(self._keys) > self._capacity:
            forgotten, _ = self._keys.popitem(last=False)
            self.horizon_ms = max(self.horizon_ms, forgotten[1])
        return True

    def missed(self, machine: Machine) -> list[MachineEvent]:
        """The events of a worker's record of ``machine`` not told yet, oldest first."""
        return [
            e
            for e in reversed(machine.events)  # a record lists its events newest first
            if e.timestamp > self.horizon_ms and _key(machine.id, e) not in self._keys
        ]
