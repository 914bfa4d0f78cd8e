"""The host's live load, measured for offers: CPU busy and memory in use.

Measuring costs tens of microseconds, an offer about ten, so :class:`LoadGauge` measures at most
every ``max_age_s`` (0.5 s) and hands out the last reading in between. CPU is psutil's busy
percentage since the previous reading: the reading taken when the gauge is made (CPU 0) starts
that interval.
"""

from __future__ import annotations

import psutil

from souq.clock import Clock
from souq.model.worker import Load

__all__ = ["LoadGauge"]

_MIB = 1024 * 1024


class LoadGauge:
    def __init__(self, clock: Clock, *, max_age_s: float = 0.5) -> None:
        self._clock = clock
        self._max_age_s = max_age_s
        self._at = clock.monotonic()
        self._last = self._measure()

    def read(self) -> Load:
        now = self._clock.monotonic()
        if now - self._at >= self._max_age_s:
            self._last = self._measure()
            self._at = now
        return self._last

    @staticmethod
    def _measure() -> Load:
        memory = psutil.virtual_memory()
        return Load(
            cpu_percent=float(psutil.cpu_percent(interval=None)),
            memory_used_mb=int(memory.used // _MIB),
            memory_percent=float(memory.percent),
        )
