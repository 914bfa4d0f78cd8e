"""When a scheduled thing runs next: a machine's ``config.schedule`` and a periodic batch job
(``souq job submit --cron``). Pure: the agent's scheduler and the brokers' periodic-job loop
ask :func:`plan` what is due and set their own timers.

A schedule is one of

* Fly's words ``hourly``, ``daily``, ``weekly``, ``monthly`` (thirty days), and Souq's
  durations (``"90s"``, ``"15m"``): an interval. As on Fly, the word says how often, not when:
  ``daily`` runs once a day, a day after the last start, not at midnight.
* a cron expression (five fields, minute hour day-of-month month day-of-week, as Nomad's
  ``periodic.cron``; cronsim reads it): the times it names, in the schedule's time zone (an
  IANA name, default ``UTC``). A time a daylight-saving change skips runs at the first minute
  after the gap (02:30 on the spring-forward night runs at 03:00); a time the change repeats
  runs once, at its first occurrence (Debian cron's rule, which cronsim follows).

Missed runs (the worker or the brokers were down across one or more of the times): at most
one catch-up run, at once, for the latest of the missed times, as Nomad's leader does when it
restores its periodic jobs; the others are counted in the run's reason, never run.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError
from pydantic import AfterValidator

from souq.clock import iso_from_ms
from souq.model.durations import seconds_of

__all__ = [
    "FLY_WORDS",
    "MIN_INTERVAL_S",
    "Due",
    "Schedule",
    "ScheduleText",
    "TimeZoneName",
    "parse_schedule",
    "plan",
    "time_zone",
]

FLY_WORDS = {
    "hourly": 3600.0,
    "daily": 86400.0,
    "weekly": 7 * 86400.0,
    "monthly": 30 * 86400.0,
}
MIN_INTERVAL_S = 1.0
_CRON_FIELDS = 5
_FIELD = re.compile(r"[0-9A-Za-z*/,\-?#]+")
_MAX_MISSED_COUNTED = 10_000  # missed times counted for the reason; more is "more than"


@dataclass(frozen=True, slots=True)
class Schedule:
    """A parsed schedule: an interval (``period_s``) or a cron expression in a time zone."""

    text: str
    period_s: float | None = None
    cron: str | None = None
    zone: str = "UTC"

    @property
    def is_cron(self) -> bool:
        return self.cron is not None

    def describe(self) -> str:
        if self.cron is None:
            return f"schedule {self.text}"
        return f"cron {self.cron!r} ({self.zone})"

    def explain(self) -> str:
        """In words: "every fifth minute of every hour (UTC)", "every 86400 s after the last
        start"."""
        if self.cron is None:
            return f"every {self.period_s:g} s after the last start ({self.text})"
        return f"{CronSim(self.cron, _start(0, self.zone)).explain()} ({self.zone})"

    def next_after(self, after_ms: int) -> int:
        """The first time after ``after_ms`` the schedule names (an interval: one period on)."""
        if self.cron is None:
            assert self.period_s is not None
            return after_ms + int(self.period_s * 1000)
        return _next_cron(self.cron, self.zone, after_ms)


@dataclass(frozen=True, slots=True)
class Due:
    """A run that is due: its time, how many earlier times were missed (not run), and why."""

    at_ms: int
    missed: int
    why: str


def time_zone(name: str | None) -> tzinfo:
    """The IANA zone ``name`` (None: UTC). ValueError when there is no such zone."""
    if name is None or name == "UTC":
        return UTC
    if name not in _zones():  # the IANA names this host knows (no path is ever opened)
        raise ValueError(
            f"time zone {name[:80]!r} is unknown: give an IANA name such as 'Europe/Madrid'"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(
            f"time zone {name!r} is unknown: give an IANA name such as 'Europe/Madrid'"
        ) from exc


@functools.cache
def _zones() -> frozenset[str]:
    return frozenset(available_timezones())


@functools.lru_cache(maxsize=1024)
def parse_schedule(text: str, zone: str | None = None) -> Schedule:
    """``text`` as a schedule (ValueError naming what is wrong: an unknown word, a malformed
    cron expression, one that never fires, an unknown time zone)."""
    time_zone(zone)
    if text in FLY_WORDS:
        return Schedule(text, period_s=FLY_WORDS[text], zone=zone or "UTC")
    words = text.split()
    if len(words) == 1:
        try:
            seconds = seconds_of(text)
        except ValueError:
            seconds = 0.0
        if seconds < MIN_INTERVAL_S:
            raise ValueError(
                f"schedule {text!r}: use hourly, daily, weekly, monthly, a duration of a second "
                "or more (e.g. '90s') or a cron expression of five fields (e.g. '0 3 * * *')"
            )
        return Schedule(text, period_s=seconds, zone=zone or "UTC")
    if len(words) != _CRON_FIELDS or not all(_FIELD.fullmatch(w) for w in words):
        raise ValueError(
            f"schedule {text!r}: a cron expression has five fields (minute hour day-of-month "
            "month day-of-week), e.g. '0 3 * * *'"
        )
    cron = " ".join(words)
    try:
        _next_cron(cron, zone or "UTC", 0)
    except CronSimError as exc:
        if _reads_with_every_month(words):  # the fields read, their days fall in no month
            raise ValueError(
                f"schedule {text!r} never fires: no month it names has that day ({exc})"
            ) from exc
        raise ValueError(f"schedule {text!r} is not a cron expression: {exc}") from exc
    except (StopIteration, OverflowError, ValueError) as exc:
        raise ValueError(f"schedule {text!r} never fires") from exc
    return Schedule(text, cron=cron, zone=zone or "UTC")


def _schedule_text(text: str | None) -> str | None:
    if text is not None:
        parse_schedule(text)
    return text


def _time_zone_name(name: str | None) -> str | None:
    time_zone(name)
    return name


# A model's schedule as written (checked with :func:`parse_schedule`, kept as text) and the IANA
# zone a cron one is read in (checked with :func:`time_zone`): a machine's ``config.schedule``
# and ``schedule_time_zone``, a periodic job's ``cron`` and ``time_zone``.
ScheduleText = Annotated[str | None, AfterValidator(_schedule_text)]
TimeZoneName = Annotated[str | None, AfterValidator(_time_zone_name)]


def plan(schedule: Schedule, anchor_ms: int, now_ms: int) -> tuple[Due | None, int]:
    """What is due at ``now_ms`` for a schedule last run (or made, or last stopped: the caller's
    ``anchor_ms``): the run due now (None: nothing yet) and the time of the next one after it
    (or after now), for the caller's timer."""
    first = schedule.next_after(anchor_ms)
    if first > now_ms:
        return None, first
    if schedule.cron is None:  # an interval runs once when due, whatever was missed
        return Due(first, 0, f"{schedule.describe()}: due at {iso_from_ms(first)}"), (
            schedule.next_after(now_ms)
        )
    latest, missed = first, 0
    while missed < _MAX_MISSED_COUNTED:
        following = schedule.next_after(latest)
        if following > now_ms:
            break
        latest, missed = following, missed + 1
    else:
        latest = _latest_cron_before(schedule, now_ms, latest)
    why = f"{schedule.describe()}: due at {iso_from_ms(latest)}"
    if missed:
        more = "more than " if missed >= _MAX_MISSED_COUNTED else ""
        why += f" ({more}{missed} earlier run{'s' if missed != 1 else ''} missed, not run)"
    return Due(latest, missed, why), schedule.next_after(now_ms)


def _latest_cron_before(schedule: Schedule, now_ms: int, floor_ms: int) -> int:
    """The latest time at or before ``now_ms`` (after ``floor_ms``), looked for a day back, then
    a year back (a schedule missed for very long)."""
    for back_ms in (86_400_000, 366 * 86_400_000):
        t = max(floor_ms, now_ms - back_ms)
        latest = None
        while (t := schedule.next_after(t)) <= now_ms:
            latest = t
        if latest is not None:
            return latest
    return floor_ms


def _reads_with_every_month(words: list[str]) -> bool:
    try:
        CronSim(" ".join([*words[:3], "*", words[4]]), _start(0, "UTC"))
    except CronSimError:
        return False
    return True


def _start(after_ms: int, zone: str) -> datetime:
    return datetime.fromtimestamp(after_ms / 1000, tz=time_zone(zone))


def _next_cron(cron: str, zone: str, after_ms: int) -> int:
    return int(next(CronSim(cron, _start(after_ms, zone))).timestamp() * 1000)
