"""Quotes on the worker: capacity held for a machine that is not made yet, for a while.

Admission judges a hold (:meth:`souq.agent.capacity.admission.Admission.check_hold`); the store
records it (``holds``) before the broker hears of it; from then on it counts against the worker's
capacity in offers and claims until a claim uses it, it is released, or it expires. The worker
itself releases an expired hold: a timer per hold (on the injected clock, so a virtual clock drives
it in tests and the simulator) marks it expired at ``expires_at`` and announces the freed capacity;
admission ignores a hold past its expiry even before its timer fires (after an agent restart,
overdue holds are expired at start).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from souq.agent.capacity.admission import Admission, HeldQuote
from souq.agent.state.hold_rows import HoldRows
from souq.agent.state.records import HoldRow, of_app
from souq.agent.state.store import Store
from souq.clock import Clock, Timer
from souq.model.base import copy_fields
from souq.model.placement import Placement
from souq.model.protocol import HoldRequest, Quote, QuoteState

__all__ = ["Quotes"]

log = logging.getLogger(__name__)


class Quotes:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        admission: Admission,
        *,
        on_change: Callable[[], None],
    ) -> None:
        self._rows = HoldRows(store)
        self._clock = clock
        self._admission = admission
        self._worker_id = admission.worker_id
        self._on_change = on_change
        self._expires: dict[str, int] = {}  # live holds: quote id -> expires_at (ms)
        self._timers: dict[str, Timer] = {}
        for hold in self._rows.in_state(QuoteState.HELD):
            self._expires[hold.id] = hold.expires_at
            admission.hold(hold.id, hold.resources, hold.expires_at)

    def start(self) -> None:
        """Arm a timer for every live hold (expiring the overdue ones at once)."""
        for quote_id in list(self._expires):
            self._arm(quote_id)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def hold(self, req: HoldRequest) -> Quote:
        now = self._clock.now_ms()
        known = self._rows.get(req.quote_id)
        if known is not None:  # a retried hold
            return known.to_quote(self._worker_id)
        want = req.config.guest.resources()
        self._admission.check_hold(req.region, want, now)
        row = copy_fields(
            HoldRow,
            req,
            id=req.quote_id,
            resources=want,
            created_at=now,
            expires_at=now + round(req.ttl_s * 1000),
        )
        stored = self._rows.put(row)
        if stored.state is QuoteState.HELD and stored.id not in self._expires:
            self._expires[stored.id] = stored.expires_at
            self._admission.hold(stored.id, stored.resources, stored.expires_at)
            self._arm(stored.id)
            self._on_change()
        return stored.to_quote(self._worker_id)

    def get(self, app: str, quote_id: str) -> Quote:
        return self._find(app, quote_id).to_quote(self._worker_id)

    def held_quote(self, app: str, quote_id: str) -> HeldQuote:
        """The quote a claim names, as admission judges it (``not_found`` if it is not the
        app's)."""
        return self._find(app, quote_id)

    def placement(self, quote_id: str) -> Placement | None:
        """The placement record the quote was made with (None for an unknown quote)."""
        hold = self._rows.get(quote_id)
        return hold.placement if hold is not None else None

    def release(self, app: str, quote_id: str) -> Quote:
        """Give the capacity back before the TTL (a hold already ended stays as it was)."""
        self._find(app, quote_id)
        self._end(quote_id, QuoteState.RELEASED)
        return self.get(app, quote_id)

    def used(self, quote_id: str) -> None:
        """A claim turned the hold into a machine's reservation (in its own transaction)."""
        self._expires.pop(quote_id, None)
        self._admission.end_hold(quote_id)
        timer = self._timers.pop(quote_id, None)
        if timer is not None:
            timer.cancel()

    def _find(self, app: str, quote_id: str) -> HoldRow:
        hint = "quotes belong to the app that asked for them"
        return of_app(self._rows.get(quote_id), app, "quote", quote_id, hint=hint)

    def _arm(self, quote_id: str) -> None:
        delay = max(0.0, (self._expires[quote_id] - self._clock.now_ms()) / 1000)
        self._timers[quote_id] = self._clock.call_later(delay, lambda: self._expire(quote_id))

    def _expire(self, quote_id: str) -> None:
        self._timers.pop(quote_id, None)
        expires_at = self._expires.get(quote_id)
        if expires_at is None:
            return
        if expires_at > self._clock.now_ms():  # the wall clock lags the timer: re-arm
            self._arm(quote_id)
            return
        log.info("quote %s expired; its capacity is free again", quote_id)
        self._end(quote_id, QuoteState.EXPIRED)

    def _end(self, quote_id: str, state: QuoteState) -> None:
        self._rows.end(quote_id, state)
        if self._expires.pop(quote_id, None) is not None:
            self._admission.end_hold(quote_id)
            timer = self._timers.pop(quote_id, None)
            if timer is not None:
                timer.cancel()
            self._on_change()
