"""NATS outages, piece by piece (the whole, on real processes: tests/integration/
test_nats_outage.py): the agent's outbox, the broker's frozen worker table and its guard, the
view's forced re-list and its event stream that tells each event once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from souq.agent import publisher as publisher_module
from souq.agent.config import AgentConfig
from souq.agent.main import Agent
from souq.agent.outbox import Outbox
from souq.broker.config import BrokerConfig
from souq.broker.service import BrokerService
from souq.bus import MemoryTransport, decode, subjects
from souq.bus.codec import decode_one_or_many, encode
from souq.clock import ManualClock, iso_from_ms
from souq.errors import Unavailable
from souq.fleet import HollowDriver
from souq.fleet.store import memory_store
from souq.model import (
    ClaimRequest,
    Heartbeat,
    Machine,
    MachineConfig,
    MachineEvent,
    MachineEventMessage,
    MachineState,
    Resources,
    StopCommand,
    WorkerInfo,
    WorkerState,
)
from souq.model.wire import decode_notes, note_of
from souq.view import ViewStore
from souq.view.liveness import Liveness
from souq.view.seen import SeenEvents

from .test_view import T0, ViewWorker, Workers, machine, wait_for

pytestmark = pytest.mark.anyio


def message(
    mid: str,
    at: int,
    *,
    record: bool = False,
    event: MachineEvent | None = None,
) -> MachineEventMessage:
    """An event message of machine ``mid`` (a ``started`` one at ``at`` unless ``event``)."""
    event = event or MachineEvent(
        type="x", status=MachineState.STARTED, source="agent", timestamp=at
    )
    return MachineEventMessage(
        machine_id=mid,
        app="web",
        worker_id="w1",
        region="mad",
        state=event.status,
        event=event,
        machine=machine(mid, MachineState.STARTED, at) if record else None,
    )


# -- the agent's outbox ------------------------------------------------------------------------


async def test_the_outbox_keeps_order_and_puts_back_ahead_of_newer_events() -> None:
    box = Outbox(limit=100)
    for at in range(3):
        box.put(message("m1", T0 + at))
    sent = box.take()
    assert len(box) == 0
    box.put(message("m1", T0 + 3))
    box.put_back(sent[1:])  # the bus took only the first one
    assert [m.event.timestamp for m in box.take()] == [T0 + 1, T0 + 2, T0 + 3]


async def test_a_full_outbox_keeps_each_machines_record_and_latest_event() -> None:
    box = Outbox(limit=8)
    box.put(message("a", T0, record=True))
    box.put(message("b", T0, record=True))
    for at in range(1, 8):
        box.put(message("a", T0 + at))
    kept = [(m.machine_id, m.event.timestamp) for m in box.take()]
    assert kept == [("a", T0), ("b", T0), ("a", T0 + 7)]
    assert box.statistics().coalesced == 6
    assert box.statistics().dropped == 0


async def test_the_outbox_wait_returns_once_something_is_queued() -> None:
    box = Outbox()
    waiting = asyncio.create_task(box.wait())
    await asyncio.sleep(0)
    assert not waiting.done()
    box.put(message("m1", T0))
    await asyncio.wait_for(waiting, 1)


# -- the agent on a bus that goes away ---------------------------------------------------------


@pytest.fixture
async def agent_on_bus() -> AsyncIterator[tuple[MemoryTransport, Agent]]:
    bus = MemoryTransport()
    agent = Agent(
        AgentConfig(region="mad", nats_url="-", cpus=4, memory_mb=4096),
        transport=bus,
        store=memory_store(),
        driver=HollowDriver(),
    )
    await agent.start()
    yield bus, agent
    await bus.set_connected(True)
    await agent.aclose()


async def test_the_agent_holds_events_while_the_bus_is_down_and_announces_its_return(
    agent_on_bus: tuple[MemoryTransport, Agent],
) -> None:
    bus, agent = agent_on_bus
    events: list[MachineEventMessage] = []
    beats: list[Heartbeat] = []

    async def on_event(subject: str, data: bytes) -> None:
        events.extend(decode_one_or_many(data, MachineEventMessage))

    async def on_beat(subject: str, data: bytes) -> None:
        beats.append(decode(data, Heartbeat))

    await bus.subscribe(subjects.ALL_EVENTS, on_event)
    await bus.subscribe(subjects.ALL_HEARTBEATS, on_beat)
    claim = ClaimRequest(
        request_id="r1", body_hash="h", app="web", region="mad", config=MachineConfig(cmd=["x"])
    )
    m = agent.commands.claim(claim)
    await wait_for(lambda: any(e.event.status == MachineState.STARTED for e in events))

    await bus.set_connected(False)
    seen = len(events)
    # The machine's life goes on without the bus.
    agent.commands.stop(StopCommand(app="web", machine_id=m.id))
    await wait_for(lambda: agent.executor.machine("web", m.id).state == MachineState.STOPPED)
    # The publisher was woken by the stop's events and found the bus down: they wait.
    pending = agent._service.stats.pending_events  # type: ignore[union-attr]
    assert pending is not None
    await wait_for(lambda: pending() >= 2)
    assert len(events) == seen

    await bus.set_connected(True)
    await wait_for(lambda: events[-1:] and events[-1].state == MachineState.STOPPED)
    offline = [e.event.status for e in events[seen:]]
    assert offline[0] == MachineState.STOPPING and offline[-1] == MachineState.STOPPED
    await wait_for(lambda: any(b.reconnects == 1 for b in beats))


# -- the broker: a frozen worker table, a guard, a rejoin --------------------------------------


def beat(worker_id: str, reconnects: int = 0) -> Heartbeat:
    info = WorkerInfo(
        id=worker_id,
        region="mad",
        state=WorkerState.UP,
        capacity=Resources(cpus=4, memory_mb=4096),
        allocated=Resources.zero(),
    )
    return Heartbeat(worker=info, seq=1, interval_s=1.0, reconnects=reconnects)


async def test_the_worker_table_is_frozen_while_the_broker_is_off_the_bus() -> None:
    clock = ManualClock()
    table = Liveness(MemoryTransport(), clock, down_after_missed=3)
    table.observe(beat("w1"))
    clock.advance(2.0)
    table.pause()
    clock.advance(60.0)  # deaf for a minute: nobody is declared dead for it
    assert table.state_of("w1") == WorkerState.UP
    table.resume()
    clock.advance(0.9)
    assert table.state_of("w1") == WorkerState.UP
    clock.advance(0.2)  # the silence before the pause still counts
    assert table.state_of("w1") == WorkerState.DOWN


async def test_a_worker_that_reconnected_is_reported_to_on_rejoin() -> None:
    table = Liveness(MemoryTransport(), ManualClock())
    rejoined: list[str] = []
    table.on_rejoin = rejoined.append
    table.observe(beat("w1"))
    table.observe(beat("w1"))
    assert rejoined == []
    table.observe(beat("w1", reconnects=1))
    assert rejoined == ["w1"]
    table.observe(beat("w1", reconnects=1).model_copy(update={"seq": 5}))
    table.observe(beat("w1", reconnects=1))  # seq back to 1: the agent restarted
    assert rejoined == ["w1", "w1"]


async def test_the_broker_refuses_at_once_while_down_and_until_its_workers_rejoin() -> None:
    bus = MemoryTransport()
    service = BrokerService(bus, BrokerConfig(nats_url="-", gather_timeout_s=5.0))
    await service.start()
    try:
        service.liveness.observe(beat("w1"))  # a worker that does not answer for now
        await bus.set_connected(False)
        with pytest.raises(Unavailable, match="NATS"):
            await service.workers()
        await bus.set_connected(True)
        with pytest.raises(Unavailable, match="waiting for its workers"):
            service.require_bus()
        await bus.publish(subjects.heartbeat("mad", "w1"), beat("w1", 1).model_dump_json().encode())
        await wait_for(lambda: not service.bus.rejoining)
        service.require_bus()
        assert service.bus.outages == 1
    finally:
        await service.close()


# -- the view: bodies refreshed, forced re-lists, each event told once -------------------------


def test_a_record_overtaken_by_an_event_still_refreshes_the_body() -> None:
    store = ViewStore()
    store.apply_machine(machine("m1", MachineState.STARTED, T0))
    newer = MachineEvent(type="x", status=MachineState.STARTING, source="agent", timestamp=T0 + 20)
    store.apply_events([note_of(message("m1", T0 + 20, event=newer))])
    record = machine("m1", MachineState.STARTED, T0 + 10).model_copy(
        update={"restarts": 3, "pid": 42}
    )
    assert store.apply_machine(record) is False  # the state stays the newer one ...
    ((_, body),) = store.app_rows("web")
    seen = Machine.model_validate_json(body)
    assert (seen.state, seen.restarts, seen.pid) == (MachineState.STARTING, 3, 42)  # ... not these
    older = record.model_copy(update={"restarts": 1, "updated_at": iso_from_ms(T0 + 5)})
    older = older.model_copy(update={"events": older.events[:0]})
    store.apply_machine(older)
    assert Machine.model_validate_json(store.app_rows("web")[0][1]).restarts == 3


def test_seen_events_tell_each_event_once_and_nothing_past_the_horizon() -> None:
    seen = SeenEvents(capacity=2, horizon_ms=T0 - 1)
    e1, e2, e3 = (
        MachineEvent(type="x", status=MachineState.STARTED, source="agent", timestamp=T0 + i)
        for i in (1, 2, 3)
    )
    record = machine("m1", MachineState.STARTED, T0).model_copy(update={"events": [e3, e2, e1]})
    assert seen.missed(record) == [e1, e2, e3]  # oldest first
    assert seen.first_time("m1", e1)
    assert not seen.first_time("m1", e1)
    assert seen.missed(record) == [e2, e3]
    seen.first_time("m1", e2)
    seen.first_time("m1", e3)  # forgets e1: the horizon moves past it
    assert seen.horizon_ms == T0 + 1
    assert seen.missed(record) == []


@pytest.fixture
async def view_and_worker() -> AsyncIterator[tuple[object, ViewWorker]]:
    from souq.view import ClusterView

    bus = MemoryTransport()
    worker = ViewWorker(bus, "w1")
    await worker.start()
    table = Workers()
    table.set("w1", WorkerState.UP)
    clock = ManualClock(T0 - 1000)
    v = ClusterView(bus, table, clock, sync_interval_s=3600, tick_s=0.01, request_timeout_s=1)
    await v.start()
    yield v, worker
    await v.close()


async def test_a_rejoined_worker_is_relisted_and_its_missed_events_told_once(
    view_and_worker: tuple[object, ViewWorker],
) -> None:
    from souq.view import ClusterView

    v, worker = view_and_worker
    assert isinstance(v, ClusterView)
    worker.machines["m1"] = machine("m1", MachineState.STARTED, T0)
    v.resync_worker("w1")
    await wait_for(lambda: v.complete and v.store.machine_json("m1") is not None)
    assert [e.machine_id for e in v.events.since(0) if e.kind == "machine"] == ["m1"]
    # Offline, the machine restarted: same state, a new pid; the stream heard nothing.
    restart = MachineEvent(
        type="restart", status=MachineState.STARTED, source="agent", timestamp=T0
    )
    record = worker.machines["m1"]
    worker.machines["m1"] = record.model_copy(
        update={"pid": 7, "restarts": 1, "events": [restart, *record.events]}
    )
    v.resync_worker("w1")  # its digest is equal: only a forced re-list sees the pid
    await wait_for(lambda: v.complete and '"pid":7' in (v.store.machine_json("m1") or ""))
    told = [e.event.type for e in v.events.since(0) if e.event is not None]
    assert told == ["launch", "restart"]
    # The agent's held copy arrives after the re-list: not told twice.
    v.on_events([note_of(message("m1", restart.timestamp, event=restart))])
    assert [e.event.type for e in v.events.since(0) if e.event is not None] == told


def test_events_ready_together_go_in_one_message_up_to_a_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    msgs = [message(f"m{i}", T0 + i, record=i == 0) for i in range(5)]
    ((n, payload),) = list(publisher_module._event_messages(msgs))
    assert n == 5 and decode_one_or_many(payload, MachineEventMessage) == msgs
    notes = decode_notes(payload)  # as the view reads them: each record decoded on demand
    assert [(n.machine_id, n.event) for n in notes] == [(m.machine_id, m.event) for m in msgs]
    assert [n.record() if n.carries_record else None for n in notes] == [m.machine for m in msgs]
    (one,) = list(publisher_module._event_messages(msgs[1:2]))
    assert one == (1, encode(msgs[1]))  # a lone event is sent as itself
    monkeypatch.setattr(publisher_module, "MESSAGE_BYTES", len(encode(msgs[1])) * 2 + 2)
    sizes = [n for n, _ in publisher_module._event_messages(msgs[1:])]
    assert sizes == [2, 2]  # in order, none lost, none over the size


async def test_changes_are_the_workers_heard_since_and_those_gone_silent() -> None:
    clock = ManualClock()
    table = Liveness(MemoryTransport(), clock, down_after_missed=3)
    for wid in ("w1", "w2", "w3"):
        table.observe(beat(wid))
    assert sorted(wid for wid, _, _ in table.changes()) == ["w1", "w2", "w3"]
    assert table.changes() == []  # nothing heard since, nobody silent yet
    clock.advance(2.0)
    table.observe(beat("w2"))
    clock.advance(1.5)  # w1 and w3 silent for 3.5 s: down; w2 heard 1.5 s ago
    got = {wid: state for wid, _, state in table.changes()}
    assert got == {"w2": WorkerState.UP, "w1": WorkerState.DOWN, "w3": WorkerState.DOWN}
    # The silent ones are told again while they stay down (a watcher keeps what it saw).
    assert {wid for wid, _, _ in table.changes()} == {"w1", "w3"}
    table.observe(beat("w1"))  # back
    assert {wid: s for wid, _, s in table.changes()}["w1"] == WorkerState.UP
