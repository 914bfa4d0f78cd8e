"""Real time with timers on the running asyncio loop: the clock for daemons whose cores set timers.

An edge module (it imports :mod:`asyncio`), kept apart so that :mod:`souq.clock` stays pure.
Deadlines are on ``time.monotonic()``, the scale of :meth:`SystemClock.monotonic`; each one is
translated to ``loop.time()`` when the timer is set, so a loop whose clock differs (uvloop keeps its
own) still fires it after the right delay. Timers must be set from the loop's thread, like any
``loop.call_at``.

:func:`daemon_clock` is the clock a daemon's main makes (the agent's, the broker's): real time,
set ahead by ``SOUQ_CLOCK_OFFSET_MS`` milliseconds when its environment has that variable. It is
for tests only: the tests of cron schedules start their daemons with a minute's start a few
seconds ahead on the daemons' clock (tests/clocks.py) rather than wait up to a minute for a real
one. Every daemon of a cluster that reads the same schedule must be given the same offset.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping

from souq.clock import SystemClock, Timer
from souq.errors import InvalidInput

__all__ = ["CLOCK_OFFSET_ENV", "MAX_OFFSET_MS", "LoopClock", "daemon_clock"]

CLOCK_OFFSET_ENV = "SOUQ_CLOCK_OFFSET_MS"
MAX_OFFSET_MS = 86_400_000  # a day either way: a test's offset is under a minute


class _LoopTimer:
    __slots__ = ("_handle", "_when")

    def __init__(self, handle: asyncio.TimerHandle, when: float) -> None:
        self._handle = handle
        self._when = when

    @property
    def when(self) -> float:
        return self._when

    @property
    def cancelled(self) -> bool:
        return self._handle.cancelled()

    def cancel(self) -> None:
        self._handle.cancel()


class LoopClock(SystemClock):
    """A :class:`SystemClock` whose timers run on ``loop``, or on the loop running when each timer
    is set."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop | None = None, *, offset_ms: int = 0
    ) -> None:
        super().__init__(offset_ms=offset_ms)
        self._loop = loop

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        loop = self._loop or asyncio.get_running_loop()
        handle = loop.call_at(loop.time() + (when - self.monotonic()), callback)
        return _LoopTimer(handle, when)


def daemon_clock(environ: Mapping[str, str] = os.environ) -> LoopClock:
    """A daemon's clock: a :class:`LoopClock` whose wall clock is ``SOUQ_CLOCK_OFFSET_MS``
    milliseconds ahead of real time (unset or empty: real time). :class:`InvalidInput` when the
    variable is not a whole number of milliseconds within a day of real time."""
    raw = environ.get(CLOCK_OFFSET_ENV, "").strip()
    if not raw:
        return LoopClock()
    hint = f"unset {CLOCK_OFFSET_ENV}: it is for tests, which set it ahead by under a minute"
    try:
        offset_ms = int(raw)
    except ValueError:
        raise InvalidInput(
            f"{CLOCK_OFFSET_ENV}={raw!r} is not a whole number of milliseconds", hint=hint
        ) from None
    if abs(offset_ms) > MAX_OFFSET_MS:
        raise InvalidInput(
            f"{CLOCK_OFFSET_ENV}={raw!r} is more than a day ({MAX_OFFSET_MS} ms)", hint=hint
        )
    return LoopClock(offset_ms=offset_ms)
