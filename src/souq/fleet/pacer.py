"""One publishing schedule for every hollow worker of a fleet: a
:class:`~souq.agent.publisher.Pacer`.

On its own, an agent's publisher runs two tasks: a heartbeat timer, and a task that wakes when
machine events are queued and sends them ``EVENTS_LINGER_S`` later. N hollow workers would run
2·N tasks, and each heartbeat and each claim's events would wake one of them and leave in a
write of its own. The fleet's pacer runs two tasks for all of them:

* heartbeats in turn: every ``tick_s``, the next ``N · tick_s / interval`` workers beat, so each
  beats once per interval (the fleet's rate is unchanged) and a tick's heartbeats leave together;
* machine events and usage: a worker's are sent ``EVENTS_LINGER_S`` after it said that events
  wait, as its own task would; the workers due at the same moment are sent in one go.
"""

from __future__ import annotations

import asyncio
import logging

from souq.agent.publisher import EVENTS_LINGER_S, Publisher
from souq.daemon import cancel_tasks

__all__ = ["TICK_S", "FleetPacer"]

log = logging.getLogger(__name__)

TICK_S = 0.05  # heartbeats go out this often, a slice of the fleet each time


class FleetPacer:
    """``start()``, hand it to each worker's :class:`~souq.agent.main.Agent`, then ``await
    aclose()`` once the workers are closed."""

    def __init__(self, *, interval_s: float, tick_s: float = TICK_S) -> None:
        self._interval = interval_s
        self._tick = tick_s
        self._publishers: dict[Publisher, None] = {}  # in the order they were added
        self._turns: list[Publisher] = []  # heartbeat order (rebuilt when the fleet changes)
        self._changed = False
        self._next = 0  # whose heartbeat is next in _turns
        self._due: dict[Publisher, float] = {}  # events waiting: when to send them, in order
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._heartbeats(), name="souq-fleet-heartbeats"),
            loop.create_task(self._events(), name="souq-fleet-events"),
        ]

    async def aclose(self) -> None:
        await cancel_tasks(self._tasks)
        self._tasks = []

    # -- the Pacer protocol --------------------------------------------------------------------

    def add(self, publisher: Publisher) -> None:
        self._publishers[publisher] = None
        self._changed = True

    def remove(self, publisher: Publisher) -> None:
        self._publishers.pop(publisher, None)
        self._due.pop(publisher, None)
        self._changed = True

    def events_waiting(self, publisher: Publisher) -> None:
        if publisher not in self._due:
            self._due[publisher] = asyncio.get_running_loop().time() + EVENTS_LINGER_S
            self._wake.set()

    # -- the two tasks -------------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        owed = 0.0  # heartbeats due and not sent yet (a fraction carries to the next tick)
        while True:
            await asyncio.sleep(self._tick)
            now = loop.time()
            owed += (now - last) * len(self._publishers) / self._interval
            last = now
            turns = self._take_turns(int(owed))
            owed -= int(owed)
            for publisher in turns:
                if publisher in self._publishers:  # not closed meanwhile
                    try:
                        await publisher.heartbeat()
                    except Exception:
                        log.exception("a hollow worker failed to send its heartbeat")

    def _take_turns(self, n: int) -> list[Publisher]:
        """The next ``n`` workers in turn (each at most once)."""
        if self._changed:
            self._turns = list(self._publishers)
            self._changed = False
        size = len(self._turns)
        if not size:
            return []
        start = self._next % size
        n = min(n, size)
        self._next = (start + n) % size
        return self._turns[start : start + n] + self._turns[: max(0, start + n - size)]

    async def _events(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._due:
                self._wake.clear()
                await self._wake.wait()
                continue
            first = next(iter(self._due.values()))  # the oldest is due first
            delay = first - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            # The loop's clock may be coarser than the delay (uvloop's counts milliseconds):
            # what the timer was set for is due once it fired, whatever the clock says.
            now = max(loop.time(), first)
            ready = []
            for publisher, at in self._due.items():
                if at > now:
                    break
                ready.append(publisher)
            for publisher in ready:
                del self._due[publisher]
            for publisher in ready:
                if publisher in self._publishers:
                    try:
                        await publisher.flush()
                    except Exception:
                        log.exception("a hollow worker failed to publish its events")
