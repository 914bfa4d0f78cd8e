"""Scheduled runs (souq.model.schedule, souq.agent.machines.schedule): next times of Fly's words and
cron expressions, time zones across a daylight-saving change, missed runs (one catch-up), the
bad inputs, and the agent's scheduler starting a machine at its time on the virtual clock."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from souq.agent.machines.schedule import Scheduler, anchor_ms, plans
from souq.agent.state.records import MachineRow
from souq.clock import VirtualClock
from souq.model.machine import MachineConfig, MachineEvent, MachineState
from souq.model.schedule import parse_schedule, plan
from souq.virtual_loop import run_virtual

MIN = 60_000
HOUR = 60 * MIN


def ms(*parts: int, tz: str = "UTC") -> int:
    return int(datetime(*parts, tzinfo=ZoneInfo(tz)).timestamp() * 1000)  # type: ignore[misc]


def test_flys_words_are_intervals_from_the_last_run_not_clock_times() -> None:
    daily = parse_schedule("daily")
    anchor = ms(2026, 3, 1, 17, 23)
    assert daily.next_after(anchor) == anchor + 24 * HOUR  # once a day, not at midnight
    assert parse_schedule("hourly").next_after(anchor) == anchor + HOUR
    assert parse_schedule("90s").next_after(anchor) == anchor + 90_000


def test_a_cron_expression_names_its_times_in_its_zone() -> None:
    s = parse_schedule("30 9 * * MON-FRI", "Europe/Madrid")
    friday_10 = ms(2026, 3, 6, 10, 0, tz="Europe/Madrid")
    assert s.next_after(friday_10) == ms(2026, 3, 9, 9, 30, tz="Europe/Madrid")  # Monday
    assert s.next_after(friday_10) == ms(2026, 3, 9, 8, 30)  # CET is UTC+1
    assert "Europe/Madrid" in s.explain() and "09:30" in s.explain()


def test_a_daily_time_in_a_zone_follows_its_daylight_saving_changes() -> None:
    s = parse_schedule("0 9 * * *", "America/New_York")
    before = s.next_after(ms(2026, 3, 7, 12, 0))  # EST, UTC-5
    after = s.next_after(before)  # 8 March: EDT, UTC-4
    assert before == ms(2026, 3, 7, 14, 0) and after == ms(2026, 3, 8, 13, 0)
    assert after - before == 23 * HOUR  # the local time stays 09:00
    # 02:30 does not exist on the spring-forward night: it runs at 03:00, once
    gap = parse_schedule("30 2 * * *", "America/New_York")
    night = gap.next_after(ms(2026, 3, 8, 0, 0, tz="America/New_York"))
    assert datetime.fromtimestamp(night / 1000, ZoneInfo("America/New_York")).hour == 3
    # 01:30 happens twice on the fall-back night: it runs once
    twice = parse_schedule("30 1 * * *", "America/New_York")
    first = twice.next_after(ms(2026, 11, 1, 0, 0, tz="America/New_York"))
    assert twice.next_after(first) - first > 23 * HOUR


def test_missed_runs_give_one_catch_up_run_for_the_latest_time() -> None:
    s = parse_schedule("0 * * * *")
    anchor = ms(2026, 1, 1, 0, 10)
    now = ms(2026, 1, 1, 5, 20)  # 01:00 .. 05:00 passed while nothing ran
    due, following = plan(s, anchor, now)
    assert due is not None and due.at_ms == ms(2026, 1, 1, 5, 0) and due.missed == 4
    assert "due at 2026-01-01T05:00:00.000Z" in due.why and "4 earlier runs missed" in due.why
    assert following == ms(2026, 1, 1, 6, 0)
    nothing, soon = plan(s, due.at_ms, now)  # once run, nothing more until 06:00
    assert nothing is None and soon == ms(2026, 1, 1, 6, 0)
    # a schedule missed for far longer than its count still runs once, for its latest time
    every = parse_schedule("* * * * *")
    long_due, _ = plan(every, anchor, anchor + 30 * 24 * HOUR)
    assert long_due is not None and long_due.at_ms == ms(2026, 1, 31, 0, 10)


@pytest.mark.parametrize(
    ("text", "zone", "says"),
    [
        ("sometimes", None, "hourly, daily"),
        ("0 0 30 2 *", None, "never fires"),
        ("0 0 31 4,6 *", None, "never fires"),
        ("61 * * * *", None, "Bad minute"),
        ("* * * *", None, "five fields"),
        ("0s", None, "a second or more"),
        ("daily", "Mars/Olympus", "unknown"),
        ("daily", "../../etc/passwd", "unknown"),
        ("daily", "Europe", "unknown"),
        ("daily", "a" * 5000, "unknown"),
    ],
)
def test_bad_schedules_are_refused_saying_why(text: str, zone: str | None, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_schedule(text, zone)


def test_a_machine_config_names_the_bad_field() -> None:
    with pytest.raises(ValidationError) as bad:
        MachineConfig.model_validate({"cmd": ["true"], "schedule": "0 0 30 2 *"})
    assert bad.value.errors()[0]["loc"] == ("schedule",)
    with pytest.raises(ValidationError) as zone:
        MachineConfig.model_validate(
            {"cmd": ["true"], "schedule": "0 3 * * *", "schedule_time_zone": "Nowhere/Land"}
        )
    assert zone.value.errors()[0]["loc"] == ("schedule_time_zone",)


def machine(schedule: str, *, state: MachineState = MachineState.STOPPED, at: int) -> MachineRow:
    return MachineRow(
        id="m1",
        app="web",
        name="m1",
        region="mad",
        request_id="r1",
        body_hash="h",
        state=state,
        config=MachineConfig.model_validate({"cmd": ["true"], "schedule": schedule}),
        placement=None,
        created_at=at,
        updated_at=at,
    )


def event(kind: str, at: int, state: MachineState) -> MachineEvent:
    return MachineEvent(type=kind, status=state, source="agent", timestamp=at)


def test_a_cron_run_due_while_the_machine_still_runs_is_skipped() -> None:
    t0 = ms(2026, 1, 1, 10, 0)
    row = machine("0 * * * *", at=t0)
    running = replace(
        row, state=MachineState.STARTED, events=(event("start", t0, MachineState.STARTED),)
    )
    assert plans([running], t0 + HOUR + 1)[0] == []  # 11:00 comes while it runs: no start
    made = replace(row, state=MachineState.CREATED)  # made with skip_launch: it is started
    assert [r.at_ms for _, r in plans([made], t0 + HOUR)[0]] == [t0 + HOUR]
    stopped = replace(  # it ran past 11:00 and stopped at 11:05: 11:00 is not caught up
        running,
        state=MachineState.STOPPED,
        events=(event("exit", t0 + HOUR + 5 * MIN, MachineState.STOPPED), *running.events),
    )
    assert anchor_ms(stopped) == t0 + HOUR + 5 * MIN
    due, wake = plans([stopped], t0 + HOUR + 6 * MIN)
    assert due == [] and wake == t0 + HOUR + 6 * MIN + 1000  # next look within a second
    due, _ = plans([stopped], t0 + 2 * HOUR)
    assert [run.at_ms for _, run in due] == [t0 + 2 * HOUR]


def test_the_scheduler_starts_a_machine_at_its_time_on_the_virtual_clock() -> None:
    clock = VirtualClock(start_ms=ms(2026, 1, 1, 10, 0, 0) + 300)  # 10:00:00.300
    rows = [machine("* * * * *", at=clock.now_ms())]
    started: list[tuple[int, str]] = []

    def start(row: MachineRow, why: str) -> None:
        started.append((clock.now_ms(), why))
        at = clock.now_ms()
        rows[0] = replace(
            row, state=MachineState.STOPPED, events=(event("exit", at, MachineState.STOPPED),)
        )

    async def main() -> None:
        scheduler = Scheduler(lambda: rows, start, clock)
        scheduler.start()
        await asyncio.sleep(3 * 60 + 1)
        await scheduler.aclose()

    run_virtual(main(), clock=clock)
    assert [at for at, _ in started] == [ms(2026, 1, 1, 10, m) for m in (1, 2, 3)]  # on time
    assert started[0][1] == "cron '* * * * *' (UTC): due at 2026-01-01T10:01:00.000Z"


def test_a_stopped_agent_catches_up_once_when_it_comes_back() -> None:
    t0 = ms(2026, 1, 1, 10, 0)
    row = machine("*/10 * * * *", at=t0)
    back = t0 + 3 * HOUR + 5 * MIN  # down from 10:00 to 13:05: 18 times passed
    due, wake = plans([row], back)
    assert [(r.at_ms, r.missed) for _, r in due] == [(t0 + 3 * HOUR, 17)]
    assert wake == back + 1000
    assert datetime.fromtimestamp(due[0][1].at_ms / 1000, UTC).hour == 13
