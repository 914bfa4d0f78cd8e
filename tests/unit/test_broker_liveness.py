"""Worker liveness from heartbeats, on a manual clock."""

from __future__ import annotations

import pytest

from souq.bus import MemoryTransport, encode, subjects
from souq.clock import ManualClock
from souq.model import Heartbeat, Resources, WorkerInfo, WorkerState
from souq.view.liveness import Liveness

from .broker_fakes import FakeWorker, started_service

pytestmark = pytest.mark.anyio


def beat(worker_id: str, region: str = "mad", *, cordoned: bool = False) -> Heartbeat:
    info = WorkerInfo(
        id=worker_id,
        region=region,
        state=WorkerState.CORDONED if cordoned else WorkerState.UP,
        capacity=Resources(cpus=4, memory_mb=4096),
        allocated=Resources.zero(),
    )
    return Heartbeat(worker=info, seq=1, interval_s=1.0)


async def test_a_worker_is_up_until_three_beats_are_missed_and_up_again_after() -> None:
    clock = ManualClock()
    table = Liveness(MemoryTransport(), clock, down_after_missed=3)
    table.observe(beat("w1"))
    assert table.state_of("w1") == WorkerState.UP
    clock.advance(2.9)
    assert table.state_of("w1") == WorkerState.UP
    assert table.live_count("mad") == 1
    clock.advance(0.2)
    assert table.state_of("w1") == WorkerState.DOWN
    assert table.live_count("mad") == 0
    assert table.knows_region("mad")  # a region stays known while its workers are down
    [listed] = table.workers()
    assert listed.state == WorkerState.DOWN
    table.observe(beat("w1"))
    assert table.state_of("w1") == WorkerState.UP


async def test_cordoned_is_as_the_worker_reports_and_still_answers() -> None:
    table = Liveness(MemoryTransport(), ManualClock())
    table.observe(beat("w1", cordoned=True))
    table.observe(beat("w2", region="syd"))
    assert table.state_of("w1") == WorkerState.CORDONED
    assert table.live_count("mad") == 1  # a cordoned worker still answers offers
    assert table.live_count() == 2
    assert table.regions() == ["mad", "syd"]
    assert table.state_of("nope") is None


async def test_as_heard_copies_only_a_worker_whose_state_is_not_the_one_it_sent() -> None:
    clock = ManualClock()
    table = Liveness(MemoryTransport(), clock, down_after_missed=3)
    sent = beat("w1", cordoned=True)
    table.observe(sent)
    [same] = table.as_heard()
    assert same is sent.worker and same.state == WorkerState.CORDONED
    table.observe(beat("w2", region="syd"))
    clock.advance(3.1)
    table.observe(beat("w2", region="syd"))
    by_id = {w.id: w for w in table.as_heard()}
    assert by_id["w1"].state == WorkerState.DOWN and by_id["w1"] is not sent.worker
    assert sent.worker.state == WorkerState.CORDONED  # the record heard is left as it was
    assert by_id["w2"].state == WorkerState.UP
    assert {(w.id, w.state) for w in table.workers()} == {(w.id, w.state) for w in by_id.values()}


async def test_heartbeats_on_the_bus_fill_the_table_with_last_seen() -> None:
    bus = MemoryTransport()
    clock = ManualClock(start_ms=1_000)
    table = Liveness(bus, clock)
    await table.start()
    await bus.publish(subjects.heartbeat("mad", "w1"), encode(beat("w1")))
    await bus.publish(subjects.heartbeat("mad", "bad"), b"not json")
    assert await table.wait_workers(1, timeout=5)
    [listed] = table.workers()
    assert (listed.id, listed.last_seen) == ("w1", 1_000)
    await table.close()
    assert not bus._subs


async def test_start_asks_workers_to_announce_themselves() -> None:
    bus = MemoryTransport()
    workers = [await FakeWorker(bus, f"w{i}").start() for i in range(3)]
    table = Liveness(bus, ManualClock())
    await table.start()  # publishes souq.discover; every fake answers with a heartbeat
    assert await table.wait_workers(3, timeout=5)
    assert sorted(w.id for w in table.workers()) == [w.id for w in workers]


async def test_wait_workers_gives_up_at_its_deadline() -> None:
    table = Liveness(MemoryTransport(), ManualClock())
    assert not await table.wait_workers(1, timeout=0.01)


async def test_the_worker_list_is_refreshed_to_the_current_allocation() -> None:
    bus = MemoryTransport()
    worker = FakeWorker(bus, "w1")
    service = await started_service(bus, worker)
    worker.allocated = Resources(cpus=3, memory_mb=100)  # changed since its last heartbeat
    [listed] = await service.workers()
    assert listed.allocated == Resources(cpus=3, memory_mb=100)


async def test_a_refresh_does_not_wait_for_a_silent_worker_beyond_its_deadline() -> None:
    bus = MemoryTransport()
    live, dead = FakeWorker(bus, "wlive"), FakeWorker(bus, "wdead")
    service = await started_service(bus, live, dead, offer_timeout_s=0.05)
    await dead.stop()
    listed = await service.workers()
    assert [w.id for w in listed] == ["wdead", "wlive"]
