"""Clocks and timers: the virtual clock, the loop-backed real clock, asyncio on virtual time."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable

import pytest

from souq.clock import (
    Clock,
    ManualClock,
    RunawayTimers,
    SystemClock,
    Timer,
    VirtualClock,
)
from souq.errors import InvalidInput
from souq.loop_clock import CLOCK_OFFSET_ENV, LoopClock, daemon_clock
from souq.virtual_loop import VirtualEventLoop, run_virtual

# Each clock satisfies the protocol (checked by mypy on this file).
CLOCKS: tuple[Callable[[], Clock], ...] = (SystemClock, LoopClock, VirtualClock, ManualClock)


def record(log: list[tuple[str, float]], clock: VirtualClock, name: str) -> Callable[[], None]:
    def callback() -> None:
        log.append((name, clock.monotonic()))

    return callback


# -- VirtualClock -------------------------------------------------------------------------------


def test_timers_fire_in_deadline_order_each_at_its_own_time() -> None:
    clock = VirtualClock()
    log: list[tuple[str, float]] = []
    clock.call_at(3.0, record(log, clock, "c"))
    clock.call_later(1.0, record(log, clock, "a"))
    clock.call_at(2.0, record(log, clock, "b"))
    assert clock.advance(2.5) == 2
    assert log == [("a", 1.0), ("b", 2.0)]
    assert clock.monotonic() == 2.5
    assert clock.pending == 1


def test_equal_deadlines_fire_in_the_order_they_were_set() -> None:
    clock = VirtualClock()
    log: list[tuple[str, float]] = []
    for name in "dbeac":
        clock.call_at(1.0, record(log, clock, name))
    clock.call_later(1.0, record(log, clock, "f"))
    clock.advance(1.0)  # a deadline exactly at the end of the window is due
    assert [name for name, _ in log] == list("dbeacf")


def test_a_cancelled_timer_never_fires() -> None:
    clock = VirtualClock()
    log: list[tuple[str, float]] = []
    dropped = clock.call_at(1.0, record(log, clock, "dropped"))
    kept = clock.call_at(2.0, record(log, clock, "kept"))
    dropped.cancel()
    assert (dropped.cancelled, kept.cancelled) == (True, False)
    assert dropped.when == 1.0
    assert clock.next_deadline() == 2.0
    assert clock.pending == 1
    clock.run()
    assert log == [("kept", 2.0)]
    kept.cancel()  # after it fired: nothing to cancel
    assert not kept.cancelled


def test_many_cancelled_timers_are_swept_without_losing_live_ones() -> None:
    clock = VirtualClock()
    log: list[tuple[str, float]] = []
    timers: list[Timer] = [clock.call_at(float(i), record(log, clock, str(i))) for i in range(1000)]
    for timer in timers:
        if int(timer.when) % 10:
            timer.cancel()
    assert clock.pending == 100
    clock.run()
    assert [name for name, _ in log] == [str(i) for i in range(0, 1000, 10)]


def test_timers_set_by_callbacks_within_the_window_fire_in_the_same_advance() -> None:
    clock = VirtualClock()
    log: list[tuple[str, float]] = []

    def first() -> None:
        log.append(("first", clock.monotonic()))
        clock.call_later(0.5, record(log, clock, "inside"))  # at 1.5, before "second"
        clock.call_later(0.0, record(log, clock, "now"))  # due at once, after its peers at 1.0
        clock.call_later(5.0, record(log, clock, "outside"))  # at 6.0, past the window

    clock.call_at(1.0, first)
    clock.call_at(1.0, record(log, clock, "peer"))
    clock.call_at(2.0, record(log, clock, "second"))
    assert clock.advance(3.0) == 5
    assert log == [("first", 1.0), ("peer", 1.0), ("now", 1.0), ("inside", 1.5), ("second", 2.0)]
    assert clock.next_deadline() == 6.0


def test_jump_moves_to_the_next_deadline_and_fires_what_is_due_then() -> None:
    clock = VirtualClock()
    log: list[tuple[str, float]] = []
    assert clock.jump() is False
    assert clock.next_deadline() is None
    clock.call_at(4.0, record(log, clock, "a"))
    clock.call_at(4.0, record(log, clock, "b"))
    clock.call_at(7.0, record(log, clock, "c"))
    assert clock.jump() is True
    assert (clock.monotonic(), log) == (4.0, [("a", 4.0), ("b", 4.0)])
    assert clock.jump() is True
    assert clock.monotonic() == 7.0
    assert clock.jump() is False


def test_a_timer_set_for_the_past_fires_now_and_time_never_goes_back() -> None:
    clock = VirtualClock()
    clock.advance(10.0)
    log: list[tuple[str, float]] = []
    clock.call_at(3.0, record(log, clock, "late"))
    assert clock.next_deadline() == 3.0
    assert clock.jump() is True
    assert log == [("late", 10.0)]
    assert clock.monotonic() == 10.0


def test_run_chains_timers_that_set_timers_until_none_is_left() -> None:
    clock = VirtualClock()
    log: list[tuple[str, float]] = []

    def countdown(n: int) -> Callable[[], None]:
        def tick() -> None:
            log.append((str(n), clock.monotonic()))
            if n:
                clock.call_later(1.5, countdown(n - 1))

        return tick

    clock.call_later(1.0, countdown(3))
    assert clock.run() == 4
    assert log == [("3", 1.0), ("2", 2.5), ("1", 4.0), ("0", 5.5)]
    assert clock.monotonic() == 5.5  # run without `until` stops at the last deadline


def test_run_until_fires_what_is_due_by_then_and_stops_there() -> None:
    clock = VirtualClock()
    log: list[tuple[str, float]] = []

    def every_second() -> None:
        log.append(("tick", clock.monotonic()))
        clock.call_later(1.0, every_second)

    clock.call_later(1.0, every_second)
    assert clock.run(until=3.5) == 3
    assert [t for _, t in log] == [1.0, 2.0, 3.0]
    assert clock.monotonic() == 3.5
    assert clock.next_deadline() == 4.0
    assert clock.run(until=4.0) == 1  # a deadline at `until` is due
    with pytest.raises(ValueError, match="run until"):
        clock.run(until=1.0)


def test_a_timer_that_rearms_itself_forever_is_reported_not_looped_on() -> None:
    clock = VirtualClock()

    def again() -> None:
        clock.call_later(0.0, again)  # never lets time move

    clock.call_at(1.0, again)
    with pytest.raises(RunawayTimers, match="max_steps=50"):
        clock.advance(1.0, max_steps=50)
    assert clock.monotonic() == 1.0
    with pytest.raises(RunawayTimers):
        clock.jump(max_steps=50)

    periodic = VirtualClock()

    def tick() -> None:
        periodic.call_later(1.0, tick)

    periodic.call_later(1.0, tick)
    with pytest.raises(RunawayTimers, match="until="):
        periodic.run(max_steps=1000)
    assert periodic.monotonic() == 1000.0
    assert periodic.run(until=2000.0, max_steps=None) == 1000


def test_now_ms_follows_monotonic_time() -> None:
    clock = VirtualClock(start_ms=1_000)
    assert (clock.monotonic(), clock.now_ms()) == (0.0, 1_000)
    for _ in range(3):
        clock.advance(0.7)
    assert clock.now_ms() == 3_100  # no drift from float steps
    clock.call_at(10.0, lambda: None)
    clock.jump()
    assert clock.now_ms() == 11_000
    stamps: list[int] = []
    clock.call_later(0.25, lambda: stamps.append(clock.now_ms()))
    clock.run(until=20.0)
    assert stamps == [11_250]
    assert clock.now_ms() == 21_000


def test_manual_clock_is_the_virtual_clock() -> None:
    clock = ManualClock(start_ms=5_000)
    clock.advance(2.0)
    assert isinstance(clock, VirtualClock)
    assert (clock.monotonic(), clock.now_ms()) == (2.0, 7_000)


def test_a_failing_callback_stops_time_at_its_deadline_and_keeps_the_rest() -> None:
    clock = VirtualClock()
    log: list[tuple[str, float]] = []

    def boom() -> None:
        raise ZeroDivisionError

    clock.call_at(1.0, boom)
    clock.call_at(2.0, record(log, clock, "after"))
    with pytest.raises(ZeroDivisionError):
        clock.advance(5.0)
    assert clock.monotonic() == 1.0
    assert clock.pending == 1
    clock.advance(4.0)
    assert log == [("after", 2.0)]


def test_a_callback_cannot_move_its_own_clock() -> None:
    clock = VirtualClock()

    def meddle() -> None:
        clock.advance(1.0)

    clock.call_at(1.0, meddle)
    with pytest.raises(RuntimeError, match="cannot move"):
        clock.run()


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_time_moves_by_finite_non_negative_steps(bad: float) -> None:
    clock = VirtualClock()
    with pytest.raises(ValueError, match="advance by"):
        clock.advance(bad)
    with pytest.raises(ValueError, match="finite deadline"):
        clock.call_at(math.nan if bad < 0 else bad, lambda: None)


# -- SystemClock and LoopClock --------------------------------------------------------------------


def test_system_clock_points_to_loop_clock_for_timers() -> None:
    with pytest.raises(RuntimeError, match="LoopClock"):
        SystemClock().call_later(1.0, lambda: None)


def test_loop_clock_timers_fire_on_the_running_loop_after_their_deadline() -> None:
    async def main() -> tuple[float, float, list[str]]:
        clock = LoopClock()
        fired: list[str] = []
        done = asyncio.Event()

        def kept() -> None:
            fired.append("kept")
            done.set()

        start = clock.monotonic()
        dropped = clock.call_later(0.01, lambda: fired.append("dropped"))
        timer = clock.call_at(start + 0.05, kept)
        dropped.cancel()
        assert (dropped.cancelled, timer.cancelled, timer.when) == (True, False, start + 0.05)
        await asyncio.wait_for(done.wait(), timeout=10)
        return start, clock.monotonic(), fired

    start, end, fired = asyncio.run(main())
    assert fired == ["kept"]  # the earlier, cancelled timer would have fired first
    assert end - start >= 0.05 - 1e-3  # asyncio may fire up to its clock resolution early


def test_loop_clock_given_a_loop_schedules_on_it() -> None:
    loop = asyncio.new_event_loop()
    try:
        clock = LoopClock(loop)
        done = loop.create_future()
        clock.call_later(0.0, lambda: done.set_result(clock.monotonic()))
        fired_at = loop.run_until_complete(asyncio.wait_for(done, timeout=10))
        assert fired_at <= clock.monotonic()
    finally:
        loop.close()


def test_an_offset_moves_the_wall_clock_and_nothing_else() -> None:
    plain, ahead = SystemClock(), LoopClock(offset_ms=45_000)
    before = plain.now_ms()
    at = ahead.now_ms()
    after = plain.now_ms()
    assert before + 45_000 <= at <= after + 45_000
    assert abs(ahead.monotonic() - plain.monotonic()) < 1.0  # deadlines on one scale


@pytest.mark.parametrize(
    ("environ", "offset_ms"),
    [({}, 0), ({CLOCK_OFFSET_ENV: ""}, 0), ({CLOCK_OFFSET_ENV: "45000"}, 45_000)],
)
def test_a_daemons_clock_is_set_ahead_by_its_environment(
    environ: dict[str, str], offset_ms: int
) -> None:
    assert daemon_clock(environ).offset_ms == offset_ms


@pytest.mark.parametrize(("raw", "says"), [("1.5", "whole number"), ("86400001", "a day")])
def test_a_bad_clock_offset_is_refused_naming_the_variable(raw: str, says: str) -> None:
    with pytest.raises(InvalidInput, match=f"{CLOCK_OFFSET_ENV}.*{says}") as caught:
        daemon_clock({CLOCK_OFFSET_ENV: raw})
    assert caught.value.hint and "tests" in caught.value.hint


# -- asyncio on virtual time ----------------------------------------------------------------------


def test_an_hour_long_sleep_takes_no_wall_time() -> None:
    clock = VirtualClock(start_ms=0)
    started = time.perf_counter()
    run_virtual(asyncio.sleep(3600), clock=clock)
    assert time.perf_counter() - started < 1.0
    assert (clock.monotonic(), clock.now_ms()) == (3600.0, 3_600_000)


def test_sleeping_tasks_wake_in_order_at_their_virtual_times() -> None:
    clock = VirtualClock()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        woke.append((name, asyncio.get_running_loop().time()))

    async def main() -> None:
        await asyncio.gather(sleeper("two", 2.0), sleeper("one", 1.0))

    run_virtual(main(), clock=clock)
    assert woke == [("one", 1.0), ("two", 2.0)]


def test_clock_timers_and_loop_timers_share_one_timeline() -> None:
    clock = VirtualClock()

    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualEventLoop)
        assert loop.clock is clock
        log: list[tuple[str, float]] = []
        answer: asyncio.Future[float] = loop.create_future()
        clock.call_later(5.0, lambda: answer.set_result(clock.monotonic()))  # a core's timer
        log.append(("answer", await asyncio.wait_for(answer, timeout=10)))
        try:
            await asyncio.wait_for(asyncio.Event().wait(), timeout=30)
        except TimeoutError:
            log.append(("timeout", loop.time()))
        return log

    assert run_virtual(main(), clock=clock) == [("answer", 5.0), ("timeout", 35.0)]


def test_with_no_deadline_anywhere_the_loop_waits_for_real_io() -> None:
    clock = VirtualClock()

    async def main() -> str:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()
        thread = threading.Thread(target=loop.call_soon_threadsafe, args=(answer.set_result, "io"))
        thread.start()
        try:
            return await answer
        finally:
            thread.join()

    assert run_virtual(main(), clock=clock) == "io"
    assert clock.monotonic() == 0.0


def test_autojump_threshold_lets_real_io_land_before_time_jumps() -> None:
    clock = VirtualClock()

    async def main() -> str:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()
        go = threading.Event()

        def reply() -> None:
            go.wait(10)
            loop.call_soon_threadsafe(answer.set_result, "real")

        thread = threading.Thread(target=reply)
        thread.start()
        loop.call_soon(go.set)  # the thread answers once the loop runs
        try:
            return await asyncio.wait_for(answer, timeout=10)
        finally:
            thread.join()

    # Idle for up to 10 real seconds before a jump: the answer lands first, at virtual time 0.
    assert run_virtual(main(), clock=clock, autojump_threshold=10.0) == "real"
    assert clock.monotonic() == 0.0


def test_without_a_threshold_a_virtual_timeout_can_beat_real_io() -> None:
    clock = VirtualClock()

    async def main() -> str:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()
        go = threading.Event()

        def reply() -> None:
            go.wait(10)  # held until the virtual timeout has fired
            loop.call_soon_threadsafe(lambda: None)

        thread = threading.Thread(target=reply)
        thread.start()
        try:
            return await asyncio.wait_for(answer, timeout=10)
        except TimeoutError:
            return "timed out"
        finally:
            go.set()
            thread.join()

    assert run_virtual(main(), clock=clock) == "timed out"
    assert clock.monotonic() == 10.0


@pytest.mark.parametrize("now_ms", [1_765_000_000_000, 1_765_000_059_999, 1_765_000_030_500])
def test_a_test_daemons_offset_puts_a_minute_where_asked(now_ms: int) -> None:
    from tests.clocks import MINUTE_MS, ahead

    clock = ahead(4.5, now_ms=now_ms)
    assert 0 <= clock.offset_ms < MINUTE_MS and clock.minute_ms % MINUTE_MS == 0
    assert clock.minute_ms - clock.offset_ms == now_ms + 4_500  # on the real clock, 4.5 s on
