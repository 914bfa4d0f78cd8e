"""Quotes on the worker: capacity held for a machine that is not made yet, for a while.

A hold is recorded in the store (``holds``) before the broker hears of it, and counts against the
worker's capacity in offers and claims until it is used by a claim, released, or expires. The
worker itself releases an expired hold: a timer per hold marks it expired at ``expires_at`` and
announces the freed capacity; claims and new holds also ignore a hold past its expiry even if its
timer has not fired yet (after an agent restart, overdue holds are expired at start).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from souq.agent.records import HoldRow
from souq.agent.store import Store
from souq.clock import Clock
from souq.errors import NotFound
from souq.model.placement import Placement
from souq.model.protocol import HoldRequest, Quote, QuoteState
from souq.model.resources import Resources

__all__ = ["Quotes"]

log = logging.getLogger(__name__)


class Quotes:
    def __init__(
        self, store: Store, clock: Clock, worker_id: str, *, on_change: Callable[[], None]
    ) -> None:
        self._store = store
        self._clock = clock
        self._worker_id = worker_id
        self._on_change = on_change
        self._live: dict[str, HoldRow] = {h.id: h for h in store.holds(QuoteState.HELD)}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def start(self) -> None:
        """Arm a timer for every live hold (expiring the overdue ones at once)."""
        for hold in list(self._live.values()):
            self._arm(hold)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def held(self) -> Resources:
        """What live holds keep from new machines."""
        now = self._clock.now_ms()
        total = Resources.zero()
        for hold in self._live.values():
            if hold.expires_at > now:
                total = total.plus(hold.resources)
        return total

    def hold(self, req: HoldRequest, capacity: Resources) -> Quote:
        now = self._clock.now_ms()
        row = HoldRow(
            id=req.quote_id,
            app=req.app,
            region=req.region,
            resources=req.config.guest.resources(),
            config=req.config,
            placement=req.placement,
            ttl_s=req.ttl_s,
            created_at=now,
            expires_at=now + round(req.ttl_s * 1000),
        )
        stored = self._store.hold(row, capacity)
        if stored.state is QuoteState.HELD and stored.id not in self._live:
            self._live[stored.id] = stored
            self._arm(stored)
            self._on_change()
        return stored.to_quote(self._worker_id)

    def get(self, app: str, quote_id: str) -> Quote:
        return self._find(app, quote_id).to_quote(self._worker_id)

    def placement(self, quote_id: str) -> Placement | None:
        """The placement record the quote was made with (None for an unknown quote)."""
        hold = self._store.get_hold(quote_id)
        return hold.placement if hold is not None else None

    def release(self, app: str, quote_id: str) -> Quote:
        """Give the capacity back before the TTL (a hold already ended stays as it was)."""
        self._find(app, quote_id)
        self._end(quote_id, QuoteState.RELEASED)
        return self.get(app, quote_id)

    def used(self, quote_id: str) -> None:
        """A claim turned the hold into a machine's reservation (in its own transaction)."""
        self._live.pop(quote_id, None)
        timer = self._timers.pop(quote_id, None)
        if timer is not None:
            timer.cancel()

    def _find(self, app: str, quote_id: str) -> HoldRow:
        hold = self._store.get_hold(quote_id)
        if hold is None or hold.app != app:
            raise NotFound(
                f"quote {quote_id} not found in app {app}",
                hint="quotes belong to the app that asked for them",
            )
        return hold

    def _arm(self, hold: HoldRow) -> None:
        delay = max(0.0, (hold.expires_at - self._clock.now_ms()) / 1000)
        loop = asyncio.get_running_loop()
        self._timers[hold.id] = loop.call_later(delay, self._expire, hold.id)

    def _expire(self, quote_id: str) -> None:
        self._timers.pop(quote_id, None)
        hold = self._live.get(quote_id)
        if hold is None:
            return
        if hold.expires_at > self._clock.now_ms():  # the clock lags the loop's timer: re-arm
            self._arm(hold)
            return
        log.info("quote %s expired; its capacity is free again", quote_id)
        self._end(quote_id, QuoteState.EXPIRED)

    def _end(self, quote_id: str, state: QuoteState) -> None:
        self._store.end_hold(quote_id, state)
        if self._live.pop(quote_id, None) is not None:
            timer = self._timers.pop(quote_id, None)
            if timer is not None:
                timer.cancel()
            self._on_change()
