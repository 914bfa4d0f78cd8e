"""Run asyncio code on a :class:`~souq.clock.VirtualClock`, like trio's autojumping ``MockClock``.

:class:`VirtualEventLoop` is a selector event loop whose ``time()`` is the virtual clock's
``monotonic()``. Its selector jumps the clock whenever the loop would otherwise wait: no callback is
ready and no I/O is ready (after ``autojump_threshold`` real seconds, 0 by default), so
``await asyncio.sleep(3600)`` returns at once with the clock 3600 s later. It jumps to the nearer of
the loop's next timer and the clock's own next deadline, so cores that set timers on the clock and
tasks that sleep on the loop share one timeline; at equal deadlines the clock's timers run first.
Nothing else of asyncio is replaced: the loop only sees a selector (a public constructor argument)
whose ``select`` returns early.

Limits: real I/O (sockets, subprocesses, threads, executors) still takes real time, and with the
default threshold of 0 the clock jumps while it is in flight, so a timeout around real I/O expires
at once. Give ``autojump_threshold`` (real seconds of idleness before a jump) when a test mixes
virtual time with real I/O, or keep that I/O in memory (``MemoryTransport``). Clock callbacks run
inside the loop's poll: they may schedule work on the loop (``call_soon``, ``Future.set_result``),
and an exception in one ends the run.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

from souq.clock import VirtualClock

__all__ = ["VirtualEventLoop", "run_virtual"]

T = TypeVar("T")


class _AutojumpSelector(selectors.DefaultSelector):
    """The platform's selector, which moves the virtual clock instead of sleeping."""

    def __init__(self, clock: VirtualClock, threshold: float) -> None:
        super().__init__()
        self._clock = clock
        self._threshold = threshold

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # `timeout` is virtual: 0 while callbacks are ready, the time to the loop's next timer, or
        # None when the loop has no timer.
        if timeout is not None and timeout <= 0:
            return super().select(0)
        events = super().select(self._threshold)
        if events or self._jump(timeout):
            return events
        return super().select(None)  # no deadline anywhere: only real I/O can wake the loop

    def _jump(self, timeout: float | None) -> bool:
        now = self._clock.monotonic()
        deadline = self._clock.next_deadline()
        if deadline is not None and (timeout is None or deadline <= now + timeout):
            return self._clock.jump()
        if timeout is None:
            return False
        # The loop fires its timers due by time() plus its clock resolution; make sure float
        # rounding never leaves the clock short of moving at all.
        step = timeout if now + timeout > now else math.nextafter(now, math.inf) - now
        self._clock.advance(step)
        return True


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time that jumps to the next deadline whenever it would wait."""

    def __init__(
        self, clock: VirtualClock | None = None, *, autojump_threshold: float = 0.0
    ) -> None:
        if not 0 <= autojump_threshold < math.inf:
            raise ValueError(f"autojump_threshold must be finite and >= 0: {autojump_threshold!r}")
        self._virtual_clock = clock if clock is not None else VirtualClock()
        super().__init__(_AutojumpSelector(self._virtual_clock, autojump_threshold))

    @property
    def clock(self) -> VirtualClock:
        return self._virtual_clock

    def time(self) -> float:
        return self._virtual_clock.monotonic()


def run_virtual(
    main: Coroutine[Any, Any, T],
    *,
    clock: VirtualClock | None = None,
    autojump_threshold: float = 0.0,
    debug: bool | None = None,
) -> T:
    """``asyncio.run(main)`` on a :class:`VirtualEventLoop` driven by ``clock`` (a new one if not
    given; pass your own to set timers on it and read the time afterwards)."""
    clock = clock if clock is not None else VirtualClock()

    def new_loop() -> asyncio.AbstractEventLoop:
        return VirtualEventLoop(clock, autojump_threshold=autojump_threshold)

    with asyncio.Runner(debug=debug, loop_factory=new_loop) as runner:
        return runner.run(main)
