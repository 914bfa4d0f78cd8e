"""Injected time and timers: daemons use real time, tests and the simulator :class:`VirtualClock`.

A :class:`Clock` tells the time (``now_ms`` for timestamps, ``monotonic`` for deadlines) and sets
timers (``call_at`` / ``call_later``, on the ``monotonic`` scale). Pure cores take a clock and
return actions such as "wake me at T"; whoever drives them sets the timer on the clock it was given.

Three clocks::

    Clock (protocol) ── SystemClock ── LoopClock      real time; timers on the running asyncio
                     │                                loop (souq.loop_clock, an edge module)
                     └─ VirtualClock (= ManualClock)  time moves only when told; timers fire in
                                                      (deadline, order set) order

Why :class:`SystemClock` sets no timers itself: a timer needs an owner that runs its callback, and
in Souq that owner is the asyncio loop of the daemon. This module is pure (the layering test walks
every import in it, local ones included), so it cannot reach the loop; a thread timer would call
into loop-owned state from another thread. So ``SystemClock.call_at`` raises an error that names
:class:`souq.loop_clock.LoopClock`, the subclass that schedules on the running loop, and
``SystemClock()`` stays what existing callers construct for reading the time.

:class:`VirtualClock` is trio's ``MockClock`` without the scheduler: ``advance`` moves time by a
step and fires every timer due on the way, ``jump`` moves to the next deadline, ``run`` jumps until
nothing is left (or ``until``). :mod:`souq.virtual_loop` runs asyncio code on it.
"""

from __future__ import annotations

import functools
import heapq
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

__all__ = [
    "DEFAULT_MAX_STEPS",
    "Clock",
    "ManualClock",
    "RunawayTimers",
    "SystemClock",
    "Timer",
    "VirtualClock",
    "iso_from_ms",
]

DEFAULT_MAX_STEPS = 1_000_000
"""How many timers one ``advance`` / ``jump`` / ``run`` fires before it calls the loop runaway."""


class Timer(Protocol):
    """A callback set for a deadline; cancelling it after it fired does nothing."""

    @property
    def when(self) -> float:
        """The deadline, on the clock's ``monotonic`` scale."""
        ...

    @property
    def cancelled(self) -> bool: ...

    def cancel(self) -> None: ...


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time in milliseconds since the epoch (for timestamps)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for deadlines and durations)."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Call ``callback`` once ``monotonic()`` reaches ``when`` (at once if it has)."""
        ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """Call ``callback`` ``delay`` seconds from now."""
        ...


class RunawayTimers(RuntimeError):
    """More timers came due than ``max_steps`` allows: most likely one re-arms itself forever."""


class SystemClock:
    """Real time. Its timers need an event loop: see the module docstring and ``LoopClock``.

    ``offset_ms`` sets its wall clock ahead (or behind) real time by that much; ``monotonic`` and
    the timers are untouched. A test's daemons run so (``SOUQ_CLOCK_OFFSET_MS``,
    :func:`souq.loop_clock.daemon_clock`) to find a minute's start a few seconds after they are
    up, instead of waiting for a real one."""

    def __init__(self, *, offset_ms: int = 0) -> None:
        self.offset_ms = offset_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms

    def monotonic(self) -> float:
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        raise RuntimeError(
            f"{type(self).__name__} has no event loop to run timers on: construct "
            "souq.loop_clock.LoopClock() in asyncio code (or a VirtualClock in tests)"
        )

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self.call_at(self.monotonic() + delay, callback)


class _VirtualTimer:
    __slots__ = ("_callback", "_clock", "_seq", "_state", "_when")

    def __init__(
        self, clock: VirtualClock, when: float, seq: int, callback: Callable[[], None]
    ) -> None:
        self._clock = clock
        self._when = when
        self._seq = seq
        self._callback: Callable[[], None] | None = callback
        self._state = "pending"  # then "fired" or "cancelled", for good

    @property
    def when(self) -> float:
        return self._when

    @property
    def cancelled(self) -> bool:
        return self._state == "cancelled"

    def cancel(self) -> None:
        if self._state == "pending":
            self._state = "cancelled"
            self._callback = None
            self._clock._forget_one()

    def __repr__(self) -> str:
        return f"<Timer #{self._seq} at {self._when:g} {self._state} {self._callback!r}>"


class VirtualClock:
    """A clock that moves only when told to, and fires its timers as it goes.

    Timers fire in (deadline, order set) order, so equal deadlines fire in the order they were set;
    a callback runs with ``monotonic()`` at its own deadline (or at the current time, if it was set
    for the past). Timers set by a callback are fired by the same call if they fall within its
    window. A callback that raises stops the call there: time stays at that timer's deadline and the
    timers after it stay set. Moving time from inside a callback is an error.
    """

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._start_ms = start_ms
        self._now = 0.0
        self._heap: list[tuple[float, int, _VirtualTimer]] = []
        self._seq = 0
        self._cancelled_in_heap = 0
        self._firing = False

    def now_ms(self) -> int:
        """``start_ms`` plus the time elapsed on ``monotonic()``, to the nearest millisecond."""
        return self._start_ms + round(self._now * 1000)

    def monotonic(self) -> float:
        return self._now

    @property
    def pending(self) -> int:
        """How many timers are set and neither fired nor cancelled."""
        return len(self._heap) - self._cancelled_in_heap

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        if not math.isfinite(when):
            raise ValueError(f"a timer needs a finite deadline, not {when!r}")
        self._seq += 1
        timer = _VirtualTimer(self, when, self._seq, callback)
        heapq.heappush(self._heap, (when, self._seq, timer))
        return timer

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self.call_at(self._now + delay, callback)

    def next_deadline(self) -> float | None:
        """The earliest deadline still set (it may be in the past: then it is due now)."""
        self._drop_cancelled_head()
        return self._heap[0][0] if self._heap else None

    def advance(self, seconds: float, *, max_steps: int | None = DEFAULT_MAX_STEPS) -> int:
        """Move time forward by ``seconds``, firing every timer due on the way, in order; return
        how many fired."""
        if not 0 <= seconds < math.inf:
            raise ValueError(
                f"advance by a finite, non-negative number of seconds, not {seconds!r}"
            )
        target = self._now + seconds
        fired = self._fire_until(target, max_steps)
        self._now = target
        return fired

    def jump(self, *, max_steps: int | None = DEFAULT_MAX_STEPS) -> bool:
        """Move to the next deadline and fire the timers due then; False when no timer is set."""
        deadline = self.next_deadline()
        if deadline is None:
            return False
        self._fire_until(max(self._now, deadline), max_steps)
        return True

    def run(self, until: float | None = None, *, max_steps: int | None = DEFAULT_MAX_STEPS) -> int:
        """Jump from deadline to deadline until no timer is left, or, given ``until`` (on the
        ``monotonic()`` scale), fire the timers due by then and stop there. Return how many fired;
        raise :class:`RunawayTimers` past ``max_steps`` timers (``None``: no bound)."""
        if until is None:
            return self._fire_until(math.inf, max_steps)
        if not self._now <= until < math.inf:
            raise ValueError(f"run until a finite time from now ({self._now:g}) on, not {until!r}")
        fired = self._fire_until(until, max_steps)
        self._now = until
        return fired

    def __repr__(self) -> str:
        return f"VirtualClock(t={self._now:g}, pending={self.pending})"

    def _fire_until(self, target: float, max_steps: int | None) -> int:
        if self._firing:
            raise RuntimeError("a timer callback cannot move the VirtualClock that fired it")
        self._firing = True
        fired = 0
        last: _VirtualTimer | None = None
        try:
            while True:
                self._drop_cancelled_head()
                if not self._heap or self._heap[0][0] > target:
                    return fired
                if max_steps is not None and fired >= max_steps:
                    raise RunawayTimers(
                        f"{fired} timers fired and more are due (max_steps={max_steps}); next "
                        f"deadline {self._heap[0][0]:g}, last fired {last!r}. A timer that re-arms "
                        "itself forever? Bound the run with until=, or raise max_steps."
                    )
                when, _, timer = heapq.heappop(self._heap)
                self._now = max(self._now, when)
                callback, timer._callback, timer._state = timer._callback, None, "fired"
                fired += 1
                last = timer
                if callback is not None:
                    callback()
        finally:
            self._firing = False

    def _drop_cancelled_head(self) -> None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
            self._cancelled_in_heap -= 1

    def _forget_one(self) -> None:
        """A timer in the heap was cancelled: rebuild the heap once most of it is dead weight."""
        self._cancelled_in_heap += 1
        if self._cancelled_in_heap > 64 and 2 * self._cancelled_in_heap > len(self._heap):
            self._heap = [entry for entry in self._heap if not entry[2].cancelled]
            heapq.heapify(self._heap)
            self._cancelled_in_heap = 0


ManualClock = VirtualClock
"""The earlier name of :class:`VirtualClock`, kept for existing tests."""


@functools.lru_cache(maxsize=4096)
def iso_from_ms(ms: int) -> str:
    """RFC 3339 timestamp with milliseconds, UTC, e.g. ``2026-11-21T14:36:50.123Z`` (cached:
    the same few instants are formatted over and over, e.g. every machine of a batch)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
