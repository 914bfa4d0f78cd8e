"""Daemons whose clock is set ahead so that a minute begins a few seconds after they are up
(``SOUQ_CLOCK_OFFSET_MS``, :func:`souq.loop_clock.daemon_clock`): the tests of cron schedules
see a run at its minute through real daemons without waiting up to a minute for a real one.

Every daemon started inside :func:`before_a_minute` gets one offset, so that they agree on the
time; daemons started before it keep real time, behind those (a run the daemons set ahead are
due to make is theirs first). The offset is chosen before the daemons start, for a minute a
try's budget and :data:`MARGIN_S` on; daemons slower to start than the budget are stopped and
started again with a longer one, rather than left to wait for the minute after."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TypeVar

from souq.loop_clock import CLOCK_OFFSET_ENV
from souq.testing import environment

__all__ = ["MARGIN_S", "MINUTE_MS", "TRIES", "Ahead", "ahead", "before_a_minute"]

T = TypeVar("T")

MINUTE_MS = 60_000
# Between the daemons up and their minute: the test's request, then the schedulers' look for new
# work (each second: souq.jobs.periodic, souq.agent.machines.schedule) before they sleep to it.
MARGIN_S = 2.5
TRIES = 3  # each with twice the time of the one before for the daemons to start


def _real_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Ahead:
    """How far the daemons' clocks are ahead of real time, and the minute they are set for."""

    offset_ms: int
    minute_ms: int  # the minute's start, on the daemons' clock

    @property
    def env(self) -> dict[str, str]:
        return {CLOCK_OFFSET_ENV: str(self.offset_ms)}

    def now_ms(self) -> int:
        """The time on the daemons' clock."""
        return _real_ms() + self.offset_ms

    def seconds_left(self) -> float:
        """Until the minute, on either clock."""
        return (self.minute_ms - self.now_ms()) / 1000


def ahead(minute_in_s: float, *, now_ms: int | None = None) -> Ahead:
    """The offset (0 to 59,999 ms ahead) that makes a minute begin ``minute_in_s`` seconds after
    ``now_ms`` (default: now)."""
    at = (now_ms if now_ms is not None else _real_ms()) + round(minute_in_s * 1000)
    offset = -at % MINUTE_MS
    return Ahead(offset_ms=offset, minute_ms=at + offset)


@contextlib.contextmanager
def before_a_minute(
    start: Callable[[], AbstractContextManager[T]], *, budget_s: float = 4.0
) -> Iterator[tuple[T, Ahead]]:
    """What ``start`` starts (its daemons, started with ``SOUQ_CLOCK_OFFSET_MS`` in this
    process's environment, which they inherit) and their clock, with at least
    :data:`MARGIN_S` left before its minute. ``budget_s``: the first try's time for them to
    start (twice that for the next). ``TimeoutError`` when they never start in time."""
    for attempt in range(TRIES):
        clock = ahead(budget_s * 2**attempt + MARGIN_S)
        with contextlib.ExitStack() as stack:
            with environment(**clock.env):
                daemons = stack.enter_context(start())
            if clock.seconds_left() >= MARGIN_S:
                yield daemons, clock
                return
    raise TimeoutError(
        f"the daemons took longer than {budget_s * 2 ** (TRIES - 1):g} s to start, {TRIES} times"
    )
