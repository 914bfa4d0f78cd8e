"""Real time with timers on the running asyncio loop: the clock for daemons whose cores set timers.

An edge module (it imports :mod:`asyncio`), kept apart so that :mod:`souq.clock` stays pure.
Deadlines are on ``time.monotonic()``, the scale of :meth:`SystemClock.monotonic`; each one is
translated to ``loop.time()`` when the timer is set, so a loop whose clock differs (uvloop keeps its
own) still fires it after the right delay. Timers must be set from the loop's thread, like any
``loop.call_at``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from souq.clock import SystemClock, Timer

__all__ = ["LoopClock"]


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

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        loop = self._loop or asyncio.get_running_loop()
        handle = loop.call_at(loop.time() + (when - self.monotonic()), callback)
        return _LoopTimer(handle, when)
