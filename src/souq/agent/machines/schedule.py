"""Scheduled machines (``config.schedule``, docs/fly-compat.md): a stopped machine (or one made
with ``skip_launch``) whose config names a schedule is started when it is due
(:mod:`souq.model.schedule` says when).

* Fly's words (``hourly``, ``daily``, ``weekly``, ``monthly``) and durations (``"90s"``): once
  that long has passed since the machine last started.
* A cron expression (``"0 3 * * *"``, in ``config.schedule_time_zone``): at each time it names
  after the machine last started or stopped. A time that comes while the machine still runs is
  skipped (a machine never overlaps itself: Nomad's ``prohibit_overlap``, always on); times
  missed while the agent was down give one catch-up run, at once, its event counting the rest.

:func:`plans` is pure; :class:`Scheduler` sets one timer, to the nearest due time (or a second
on, to see new and changed machines), and starts the machines that are due, as a user's start
would (an event of source ``agent`` whose message says why: ``schedule daily: due at …``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from souq.agent.state.records import MachineRow
from souq.clock import Clock
from souq.errors import SouqError
from souq.model import MachineState
from souq.model.choices import RUN_STARTS, EventType
from souq.model.schedule import Due, plan

__all__ = ["Scheduler", "anchor_ms", "plans"]

log = logging.getLogger(__name__)
TICK_S = 1.0  # the longest the scheduler waits: a new or changed machine is seen this late
_ENDS = (EventType.EXIT, EventType.STOP)
_IDLE = (MachineState.CREATED, MachineState.STOPPED)  # made without a start, or stopped


def anchor_ms(row: MachineRow) -> int:
    """Where the machine's schedule counts from: an interval from its last start; a cron
    expression from its last start or stop (times while it ran are skipped). Else its making."""
    kinds = RUN_STARTS if row.config.schedule_period_s is not None else (*RUN_STARTS, *_ENDS)
    return max((e.timestamp for e in row.events if e.type in kinds), default=row.created_at)


def plans(rows: Iterable[MachineRow], now_ms: int) -> tuple[list[tuple[MachineRow, Due]], int]:
    """The stopped (or never started) scheduled machines due at ``now_ms`` (each with why),
    and the nearest later due time of any of them (``now_ms + TICK_S`` at most)."""
    due: list[tuple[MachineRow, Due]] = []
    wake = now_ms + int(TICK_S * 1000)
    for row in rows:
        schedule = row.config.parsed_schedule()
        if schedule is None or row.state not in _IDLE:
            continue
        run, following = plan(schedule, anchor_ms(row), now_ms)
        if run is not None:
            due.append((row, run))
        wake = min(wake, following)
    return due, wake


class Scheduler:
    """Starts due machines: ``start(row, why)`` for each, at its time."""

    def __init__(
        self,
        rows: Callable[[], Iterable[MachineRow]],
        start: Callable[[MachineRow, str], None],
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
            due, wake_ms = plans(self._rows(), self._clock.now_ms())
            for row, run in due:
                try:
                    self._start(row, run.why)
                except SouqError as exc:  # e.g. an operation under way: the next round retries
                    log.info("scheduled start of %s deferred: %s", row.id, exc)
            await asyncio.sleep(max(0.0, (wake_ms - self._clock.now_ms()) / 1000))

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
