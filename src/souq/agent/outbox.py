"""The agent's outbox: machine events on their way to the bus, kept while the bus is down.

The executor puts every event here (``put``, never blocking: the life cycle of a machine does
not wait for the network). The service sends them in order while the bus is up, and stops taking
them out while it is down: nothing is dropped by an outage. Past ``limit`` events (a long outage
with machines that keep changing) the outbox *coalesces*: it keeps, for each machine, its first
event with the machine's record (so that a view learns of a new machine) and its latest event
(so that it learns the state now), in their order. The brokers' anti-entropy re-lists the worker
after an outage, which brings back what coalescing left out. Only when more machines than
about ``limit`` changed are the oldest events dropped (and counted).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from souq.model.protocol import MachineEventMessage

__all__ = ["Outbox", "OutboxStatistics"]

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 10_000


@dataclass(frozen=True)
class OutboxStatistics:
    pending: int  # events waiting to be sent
    coalesced: int  # events left out by coalescing, since the agent started
    dropped: int  # events dropped because even one per machine was too many


class Outbox:
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError("an outbox holds at least one event")
        self._limit = limit
        self._items: deque[MachineEventMessage] = deque()
        self._ready = asyncio.Event()
        self._coalesced = 0
        self._dropped = 0
        self._listener: Callable[[], None] | None = None

    def listen(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` whenever events are queued (one schedule shared by many workers,
        instead of a task that :meth:`wait`-s: see :class:`souq.agent.publisher.Pacer`)."""
        self._listener = callback

    def __len__(self) -> int:
        return len(self._items)

    def put(self, msg: MachineEventMessage) -> None:
        """Queue one event (the executor's ``on_event``)."""
        self._items.append(msg)
        if len(self._items) > self._limit:
            self._shrink()
        self._ready.set()
        if self._listener is not None:
            self._listener()

    def put_back(self, msgs: Iterable[MachineEventMessage]) -> None:
        """Return events that could not be sent, ahead of the ones queued since."""
        self._items.extendleft(reversed(list(msgs)))
        if len(self._items) > self._limit:
            self._shrink()
        if self._items:
            self._ready.set()
            if self._listener is not None:
                self._listener()

    def take(self) -> list[MachineEventMessage]:
        """Every queued event, oldest first; the outbox is empty afterwards."""
        items = list(self._items)
        self._items.clear()
        self._ready.clear()
        return items

    async def wait(self) -> None:
        """Until there is something to send."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()

    def statistics(self) -> OutboxStatistics:
        return OutboxStatistics(
            pending=len(self._items), coalesced=self._coalesced, dropped=self._dropped
        )

    def _shrink(self) -> None:
        before = len(self._items)
        latest: dict[str, int] = {}
        first_record: dict[str, int] = {}
        for i, msg in enumerate(self._items):
            latest[msg.machine_id] = i
            if msg.machine is not None:
                first_record.setdefault(msg.machine_id, i)
        keep = set(latest.values()) | set(first_record.values())
        kept = deque(msg for i, msg in enumerate(self._items) if i in keep)
        self._coalesced += before - len(kept)
        # Leave room for a quarter of the limit, so that the next shrink is that far away.
        dropped = max(0, len(kept) - (self._limit - self._limit // 4))
        for _ in range(dropped):
            kept.popleft()
        self._dropped += dropped
        self._items = kept
        log.warning(
            "the outbox held %d events: kept the first and the latest of each machine (%d), "
            "dropped %d; the brokers' anti-entropy restores the rest",
            before,
            len(kept),
            dropped,
        )
