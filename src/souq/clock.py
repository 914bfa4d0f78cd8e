"""Injected time: daemons use :class:`SystemClock`, tests and the simulator :class:`ManualClock`."""

from __future__ import annotations

import functools
import time
from datetime import UTC, datetime
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock", "iso_from_ms"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time in milliseconds since the epoch (for timestamps)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for deadlines and durations)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._ms = start_ms
        self._mono = 0.0

    def now_ms(self) -> int:
        return self._ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._mono += seconds
        self._ms += int(seconds * 1000)


@functools.lru_cache(maxsize=4096)
def iso_from_ms(ms: int) -> str:
    """RFC 3339 timestamp with milliseconds, UTC, e.g. ``2026-11-21T14:36:50.123Z`` (cached:
    the same few instants are formatted over and over, e.g. every machine of a batch)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
