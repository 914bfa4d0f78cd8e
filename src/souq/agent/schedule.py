"""Scheduled machines (Fly's ``schedule``): a stopped machine whose config names a schedule is
started again once a period has passed since it last started (``hourly``, ``daily``,
``weekly``, ``monthly`` — thirty days — or, Souq's own, a duration such as ``"90s"``).

:func:`due` is pure; :class:`Scheduler` looks at the agent's machines once a second and starts
the ones that are due, as a user's start would (recorded with source ``agent`` and why)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from souq.agent.records import MachineRow
from souq.clock import Clock
from souq.errors import SouqError
from souq.model import MachineState
from souq.model.machine import schedule_period_s

__all__ = ["Scheduler", "due"]

log = logging.getLogger(__name__)
TICK_S = 1.0
_STARTS = ("launch", "start", "restart")


def last_start_ms(row: MachineRow) -> int:
    """When the machine last started (its newest start event), else when it was made."""
    return max((e.timestamp for e in row.events if e.type in _STARTS), default=row.created_at)


def due(rows: Iterable[MachineRow], now_ms: int) -> list[MachineRow]:
    """The stopped machines with a schedule whose period has passed since they last started."""
    out = []
    for row in rows:
        schedule = row.config.schedule
        if schedule is None or row.state is not MachineState.STOPPED:
            continue
        if now_ms - last_start_ms(row) >= schedule_period_s(schedule) * 1000:
            out.append(row)
    return out


class Scheduler:
    """Starts due machines: ``start(row)`` for each, once a second."""

    def __init__(
        self,
        rows: Callable[[], Iterable[MachineRow]],
        start: Callable[[MachineRow], None],
        clock: Clock,
    ) -> None:
        self._rows = rows
        self._start = start
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="souq-schedule")

    async def _run(self) -> None:
        while True:
            for row in due(self._rows(), self._clock.now_ms()):
                try:
                    self._start(row)
                except SouqError as exc:  # e.g. an operation under way: the next tick retries
                    log.info("scheduled start of %s deferred: %s", row.id, exc)
            await asyncio.sleep(TICK_S)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
