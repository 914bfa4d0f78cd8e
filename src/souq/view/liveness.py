"""Worker liveness: the broker's table of workers, learnt from their heartbeats.

A worker is ``up`` while its heartbeats arrive, ``cordoned`` when it says so, and ``down`` once
``down_after_missed`` of its heartbeat intervals pass without one. The state is computed when the
table is read, so no timer runs; the injected clock makes it testable.

Heartbeats come every interval, so the capacity they report can lag a claim or a destroy by that
much. :meth:`Liveness.refresh` asks every worker for a heartbeat now (``souq.discover``) and waits
until each live one has answered, for a table that is exact at the time of the call.

While the broker's own connection to the bus is down (:meth:`Liveness.pause`) the table is
frozen: silence the broker cannot hear through is no sign of a dead worker, so nobody goes
``down`` for it, and :meth:`Liveness.resume` gives every worker the time it was paused back.
A heartbeat whose ``reconnects`` differs from the last one (the worker lost the bus and is back)
or whose ``seq`` went back (its agent restarted) is reported to ``on_rejoin``: the cluster view
re-lists that worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from souq.bus import Subscription, Transport, decode, subjects
from souq.bus.codec import decoding
from souq.clock import Clock
from souq.market.book import WorkerBook
from souq.model import Heartbeat, WorkerInfo, WorkerState, WorkerUsage

__all__ = ["Liveness"]

log = logging.getLogger(__name__)

UP_INDEX_TTL_S = 0.5  # how stale the sampling population of a region may be


@dataclass
class _Entry:
    info: WorkerInfo
    interval_s: float
    last_beat: float  # clock.monotonic() when the last heartbeat arrived
    last_seen_ms: int
    received: int  # the table's heartbeat counter when this one arrived
    reconnects: int  # the worker's count of reconnections to the bus
    seq: int  # the heartbeat's number (from 1 when the agent starts)
    last_word: float = 0.0  # clock.monotonic() of its last other word (usage, an answer)


class Liveness:
    def __init__(
        self,
        transport: Transport,
        clock: Clock,
        *,
        down_after_missed: int = 3,
        book: WorkerBook | None = None,
        usage: bool = True,
    ) -> None:
        """``usage``: listen to the workers' usage too (a reader of names needs none)."""
        self._transport = transport
        self._usage = usage
        # What every worker has promised (souq.market.book): heartbeats and usage messages
        # keep it fresh, and placements draw their candidates from it.
        self.book = book if book is not None else WorkerBook()
        self._clock = clock
        self._down_after_missed = down_after_missed
        self._workers: dict[str, _Entry] = {}
        self._heard: set[str] = set()  # workers heard since the last call of `changes`
        self._sub: Subscription | None = None
        self._usage_sub: Subscription | None = None
        self._received = 0
        self._beat = asyncio.Event()
        self._up_index: dict[str, tuple[float, list[str]]] = {}
        self._paused_at: float | None = None
        self.on_rejoin: Callable[[str], None] | None = None

    async def start(self) -> None:
        """Listen to heartbeats, then ask every worker to announce itself at once."""
        on_heartbeat = decoding(
            lambda data: decode(data, Heartbeat),
            self.observe,
            ignoring="ignoring a heartbeat",
            log=log,
        )
        on_usage = decoding(
            lambda data: decode(data, WorkerUsage),
            self.observe_usage,
            ignoring="ignoring a usage message",
            log=log,
        )
        self._sub = await self._transport.subscribe(subjects.ALL_HEARTBEATS, on_heartbeat)
        if self._usage:
            self._usage_sub = await self._transport.subscribe(subjects.ALL_USAGE, on_usage)
        await self.discover()

    async def discover(self) -> None:
        await self._transport.publish(subjects.DISCOVER, b"")

    async def close(self) -> None:
        for sub in (self._sub, self._usage_sub):
            if sub is not None:
                await sub.unsubscribe()
        self._sub = self._usage_sub = None

    def observe(self, beat: Heartbeat) -> None:
        """Record one heartbeat."""
        old = self._workers.get(beat.worker.id)
        if (
            old is None
            or old.info.region != beat.worker.region
            or old.info.state != beat.worker.state
            or self._state(old) == WorkerState.DOWN
        ):
            self._up_index.clear()  # someone joined, moved, came back or changed state
        self._received += 1
        # Kept in the order of their last heartbeats (the oldest first): see :meth:`changes`.
        self._workers.pop(beat.worker.id, None)
        self._heard.add(beat.worker.id)
        self._workers[beat.worker.id] = _Entry(
            info=beat.worker,
            interval_s=beat.interval_s,
            last_beat=self._clock.monotonic(),
            last_seen_ms=self._clock.now_ms(),
            received=self._received,
            reconnects=beat.reconnects,
            seq=beat.seq,
        )
        self.book.observe(beat.worker, layers=beat.layers)
        self._beat.set()
        self._beat = asyncio.Event()
        rejoined = old is not None and (old.reconnects != beat.reconnects or beat.seq < old.seq)
        if rejoined and self.on_rejoin is not None:
            self.on_rejoin(beat.worker.id)

    # -- the broker's own outages ----------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused_at is not None

    def pause(self) -> None:
        """The broker lost the bus: freeze every worker's state as it is."""
        if self._paused_at is None:
            self._paused_at = self._clock.monotonic()

    def resume(self) -> None:
        """The broker has the bus again: the silence of the pause does not count."""
        if self._paused_at is None:
            return
        now = self._clock.monotonic()
        paused_for = now - self._paused_at
        self._paused_at = None
        for entry in self._workers.values():
            entry.last_beat = min(now, entry.last_beat + paused_for)
            entry.last_word = min(now, entry.last_word + paused_for)
        self._up_index.clear()

    async def wait_workers(self, count: int, timeout: float) -> bool:
        """Wait until at least ``count`` workers are known; False if ``timeout`` passes first."""
        try:
            async with asyncio.timeout(timeout):
                while len(self._workers) < count:
                    await self._beat.wait()
        except TimeoutError:
            return False
        return True

    async def refresh(self, timeout: float) -> None:
        """Ask for a heartbeat now and wait until every live worker has sent one (or until
        ``timeout``: a worker that died a moment ago must not hold up the answer)."""
        mark = self._received
        waiting = {
            worker_id
            for worker_id, entry in self._workers.items()
            if self._state(entry) != WorkerState.DOWN
        }
        await self.discover()
        try:
            async with asyncio.timeout(timeout):
                while any(self._workers[w].received <= mark for w in waiting):
                    await self._beat.wait()
        except TimeoutError:
            pass

    def _state(self, entry: _Entry) -> WorkerState:
        now = self._paused_at if self._paused_at is not None else self._clock.monotonic()
        # A worker busy with a burst of claims may send its heartbeats late; its usage messages
        # and answers say it is alive as well.
        silent_for = now - max(entry.last_beat, entry.last_word)
        if silent_for > self._down_after_missed * entry.interval_s:
            return WorkerState.DOWN
        if entry.info.state in (WorkerState.CORDONED, WorkerState.DRAINING):
            return entry.info.state
        return WorkerState.UP

    def changes(self) -> list[tuple[str, str, WorkerState]]:
        """``(id, region, state now)`` of every worker whose state may have changed since the
        last call: those heard since (a heartbeat carries cordons and comebacks), and those
        silent long enough to be down (the table is in heartbeat order, so the scan stops at
        the first worker still heard in time). What a watcher of states needs each tick,
        without visiting every worker."""
        out = [
            (wid, e.info.region, self._state(e))
            for wid in self._heard
            if (e := self._workers.get(wid)) is not None
        ]
        self._heard.clear()
        for wid, e in self._workers.items():
            state = self._state(e)
            if state != WorkerState.DOWN:
                if e.last_word <= e.last_beat:
                    break  # heard in time by its heartbeat: so is every worker after it
                continue  # alive by other word only: those after it may still be down
            out.append((wid, e.info.region, state))
        return out

    def states(self) -> list[tuple[str, str, WorkerState]]:
        """``(id, region, state now)`` of every worker ever heard of, in no order: what
        :meth:`workers` tells without copying each worker's record."""
        return [(wid, e.info.region, self._state(e)) for wid, e in self._workers.items()]

    def workers(self) -> list[WorkerInfo]:
        """Every worker ever heard of, with its state now, by region then id."""
        out = [
            e.info.model_copy(update={"state": self._state(e), "last_seen": e.last_seen_ms})
            for e in self._workers.values()
        ]
        return sorted(out, key=lambda w: (w.region, w.id))

    def as_heard(self) -> list[WorkerInfo]:
        """Every worker ever heard of, in no order, with its state now but not its
        ``last_seen``: each worker's own record where its state is the one it sent (no copy),
        a copy only where it differs (down). What summaries of the table read: the spot price
        round, a region chosen for a create, the metrics' counts."""
        out = []
        for e in self._workers.values():
            state = self._state(e)
            out.append(
                e.info if state is e.info.state else e.info.model_copy(update={"state": state})
            )
        return out

    def info(self, worker_id: str) -> WorkerInfo | None:
        """The worker as its last heartbeat described it (capacity, allocation, labels)."""
        entry = self._workers.get(worker_id)
        return None if entry is None else entry.info

    def state_of(self, worker_id: str) -> WorkerState | None:
        entry = self._workers.get(worker_id)
        return None if entry is None else self._state(entry)

    def is_live(self, worker_id: str) -> bool:
        """Whether the worker is heard (up, cordoned or draining: not down)."""
        entry = self._workers.get(worker_id)
        return entry is not None and self._state(entry) != WorkerState.DOWN

    def observe_usage(self, usage: WorkerUsage) -> None:
        """A usage message (sent after every change of what the worker promised)."""
        self.heard(usage.worker_id)
        self.book.observe_usage(usage)

    def heard(self, worker_id: str) -> None:
        """Word from the worker other than a heartbeat (a usage message, an answer to a
        request): it is alive, though it may be too busy to send heartbeats on time."""
        entry = self._workers.get(worker_id)
        if entry is not None:
            entry.last_word = self._clock.monotonic()

    def heard_since(self, worker_id: str, since: float) -> bool:
        """Whether any word of the worker (a heartbeat, a usage message, an answer) arrived
        after ``since`` (``clock.monotonic()``): it was alive then, whatever it has not
        answered meanwhile."""
        entry = self._workers.get(worker_id)
        return entry is not None and max(entry.last_beat, entry.last_word) > since

    def regions(self) -> list[str]:
        """Regions named by any heartbeat, even if all their workers are down now."""
        return sorted({e.info.region for e in self._workers.values()})

    def knows_region(self, region: str) -> bool:
        return any(e.info.region == region for e in self._workers.values())

    def up_workers(self, region: str) -> list[str]:
        """Ids of the region's ``up`` workers, sorted: whom a sampling broker draws from.

        Cached: recomputed when a worker joins, changes region or state, or comes back, and at
        least every ``UP_INDEX_TTL_S`` (so a worker that fell silent leaves it within that), so
        that a placement does not walk the whole table of a large region."""
        now = self._clock.monotonic()
        cached = self._up_index.get(region)
        if cached is not None and now - cached[0] < UP_INDEX_TTL_S:
            return cached[1]
        ids = sorted(
            worker_id
            for worker_id, e in self._workers.items()
            if e.info.region == region and self._state(e) == WorkerState.UP
        )
        self._up_index[region] = (now, ids)
        return ids

    def live_count(self, region: str | None = None) -> int:
        """Workers that answer requests (``up`` or ``cordoned``), in one region or in all."""
        return sum(
            1
            for e in self._workers.values()
            if (region is None or e.info.region == region) and self._state(e) != WorkerState.DOWN
        )
