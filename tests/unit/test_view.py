"""The cluster view: stale changes are dropped, anti-entropy heals a missed event, an unknown
machine is fetched, worker state changes become events, and the broker serves lists from it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import msgspec
import pytest

from souq.broker.app import create_app
from souq.bus import MemoryTransport, decode, ok_reply, subjects
from souq.bus.subjects import verb_of
from souq.clock import ManualClock, iso_from_ms
from souq.model import (
    Heartbeat,
    Machine,
    MachineConfig,
    MachineEvent,
    MachineEventMessage,
    MachineRef,
    MachineState,
    Placement,
    Resources,
    WorkerDigest,
    WorkerInfo,
    WorkerState,
)
from souq.model.wire import MachineEventNote, note_of
from souq.testing import eventually
from souq.view import (
    ClusterView,
    EventLog,
    ViewStore,
    feed,
    fits,
    machines_digest,
    summarise_regions,
)
from souq.view.store import machine_text

from .broker_fakes import FakeWorker, started_service

pytestmark = pytest.mark.anyio

T0 = 1_700_000_000_000


def machine(mid: str, state: MachineState, at: int, *, worker: str = "w1", app: str = "web"):  # type: ignore[no-untyped-def]
    return Machine(
        id=mid,
        name=mid,
        app=app,
        region="mad",
        worker_id=worker,
        state=state,
        config=MachineConfig(cmd=["sleep", "1"]),
        created_at=iso_from_ms(T0),
        updated_at=iso_from_ms(at),
        events=[MachineEvent(type="launch", status=state, source="user", timestamp=at)],
    )


def event(
    mid: str, state: MachineState, at: int, *, worker: str = "w1", record: Machine | None = None
) -> MachineEventNote:
    """An event as the view reads it off the bus."""
    msg = MachineEventMessage(
        machine_id=mid,
        app="web",
        worker_id=worker,
        region="mad",
        state=state,
        event=MachineEvent(type="x", status=state, source="agent", timestamp=at),
        machine=record,
    )
    return note_of(msg)


def test_an_event_note_declares_the_fields_of_an_event_message() -> None:
    """MachineEventNote is MachineEventMessage as msgspec reads it (two declarations of one
    message, as each library needs its own): the same fields, in order, of the same types, but
    the record, kept as the JSON it came as."""
    note = {f.encode_name: f.type for f in msgspec.structs.fields(MachineEventNote)}
    message = {name: f.annotation for name, f in MachineEventMessage.model_fields.items()}
    assert list(note) == list(message)
    assert note.pop("machine") is msgspec.Raw
    assert message.pop("machine") == Machine | None
    assert note == message


def test_a_stale_event_is_dropped_and_an_equal_time_one_applied() -> None:
    store = ViewStore()
    store.apply_machine(machine("m1", MachineState.STARTED, T0 + 10))
    assert store.apply_events([event("m1", MachineState.STOPPING, T0 + 5)]) is False
    assert store.apply_events([event("m1", MachineState.STOPPING, T0 + 10)]) is True
    assert store.apply_events([event("m1", MachineState.STOPPED, T0 + 20)]) is True
    assert store.apply_events([event("m2", MachineState.STARTED, T0)]) is None
    # an older full record does not undo a newer event either
    assert store.apply_machine(machine("m1", MachineState.STARTED, T0 + 15)) is False
    ((_, body),) = store.app_rows("web")
    assert Machine.model_validate_json(body).state == MachineState.STOPPED


def test_destroyed_machines_leave_lists_but_stay_as_tombstones() -> None:
    store = ViewStore()
    store.apply_machine(machine("m1", MachineState.STARTED, T0))
    store.apply_events([event("m1", MachineState.DESTROYED, T0 + 1)])
    assert store.app_rows("web") == []
    assert store.apply_events([event("m1", MachineState.STARTED, T0)]) is False  # no resurrection
    assert store.prune(destroyed_before=T0 + 2) == 1
    assert store.size() == 0


def test_reconcile_replaces_a_workers_rows_but_keeps_fresher_ones() -> None:
    store = ViewStore()
    store.apply_machine(machine("gone", MachineState.STARTED, T0))
    store.apply_machine(machine("new", MachineState.STARTED, T0 + 100))  # after the listing
    store.apply_machine(machine("kept", MachineState.STARTED, T0))
    listed = [machine("kept", MachineState.STOPPED, T0 + 1)]
    store.reconcile_worker("w1", listed, before=T0 + 50)
    ids = sorted(Machine.model_validate_json(b).id for _, b in store.app_rows("web"))
    assert ids == ["kept", "new"]
    expected = machines_digest(
        [("kept", "stopped", iso_from_ms(T0 + 1)), ("new", "started", iso_from_ms(T0 + 100))]
    )
    assert store.digest("w1") == expected
    assert store.digests() == {"w1": expected}


def test_apps_count_machines_by_state_and_region() -> None:
    store = ViewStore()
    store.apply_machine(machine("a", MachineState.STARTED, T0))
    store.apply_machine(machine("b", MachineState.STOPPED, T0))
    store.apply_machine(machine("c", MachineState.STARTED, T0, app="api"))
    apps = {a.app: a for a in store.apps()}
    assert apps["web"].machines == 2
    assert apps["web"].states == {"started": 1, "stopped": 1}
    assert apps["api"].regions == ["mad"]


async def test_the_event_log_resumes_filters_and_stays_bounded() -> None:
    log = EventLog(capacity=3)
    for i in range(5):
        log.append_machine(
            machine_id=f"m{i}",
            app="web" if i % 2 else "api",
            worker_id="w1",
            region="mad",
            event=MachineEvent(type="x", status=MachineState.STARTED, source="agent", timestamp=i),
        )
    assert [e.seq for e in log.since(0)] == [3, 4, 5]  # the ring holds the last three
    assert [e.seq for e in log.since(3)] == [4, 5]
    assert [e.machine_id for e in log.since(0, app="web")] == ["m3"]
    assert await log.wait_after(4, timeout=0.01)
    assert not await log.wait_after(5, timeout=0.01)
    # Resuming after an id whose successors are gone, or that this log never gave, is a gap.
    assert log.missed(0) is None and log.missed(2) is None and log.missed(5) is None
    gone = log.missed(1)
    assert gone is not None and (gone.after, gone.resume_from) == (1, 3)
    assert "events 2 to 2 are no longer held" in gone.message
    ahead = log.missed(9)
    assert ahead is not None and ahead.resume_from == 3 and "another broker" in ahead.message


def test_regions_count_what_fits_on_up_workers_only() -> None:
    def worker(wid: str, state: WorkerState, cpus_used: float) -> WorkerInfo:
        return WorkerInfo(
            id=wid,
            region="mad",
            state=state,
            capacity=Resources(cpus=4, memory_mb=4096),
            allocated=Resources(cpus=cpus_used, memory_mb=0),
        )

    size = Resources(cpus=1, memory_mb=1024)
    assert fits(worker("a", WorkerState.UP, 1.5), size) == 2  # cpus: 2.5 -> 2; memory: 4
    (mad,) = summarise_regions(
        [
            worker("a", WorkerState.UP, 1.5),
            worker("b", WorkerState.DOWN, 0),
            worker("c", WorkerState.CORDONED, 0),
        ],
        size,
    )
    assert (mad.workers, mad.workers_up, mad.workers_down, mad.workers_cordoned) == (3, 1, 1, 1)
    assert mad.fits == 2


class ViewWorker:
    """A worker that answers what the view asks: digest, list and get."""

    def __init__(self, bus: MemoryTransport, wid: str) -> None:
        self.bus = bus
        self.id = wid
        self.machines: dict[str, Machine] = {}
        self.asked: list[str] = []  # the subjects its digest was asked on

    async def start(self) -> None:
        await self.bus.subscribe(subjects.all_workers("digest"), self._digest)
        await self.bus.subscribe(subjects.worker_verbs(self.id), self._verb)

    def live(self) -> list[Machine]:
        return [m for m in self.machines.values() if m.state != MachineState.DESTROYED]

    async def _digest(self, subject: str, data: bytes) -> bytes:
        self.asked.append(subject)
        rows = [(m.id, m.state.value, m.updated_at) for m in self.live()]
        digest = WorkerDigest(worker_id=self.id, machines=len(rows), digest=machines_digest(rows))
        return ok_reply(digest)

    async def _verb(self, subject: str, data: bytes) -> bytes:
        if verb_of(subject) == "list":
            return ok_reply(self.live())
        if verb_of(subject) == "digest":
            return await self._digest(subject, data)
        ref = decode(data, MachineRef)
        return ok_reply(self.machines[ref.machine_id])


class Workers:
    def __init__(self) -> None:
        self.table: dict[str, WorkerInfo] = {}

    def states(self) -> list[tuple[str, str, WorkerState]]:
        return [(w.id, w.region, w.state) for w in self.table.values()]

    def changes(self) -> list[tuple[str, str, WorkerState]]:
        return self.states()

    def state_of(self, worker_id: str) -> WorkerState | None:
        w = self.table.get(worker_id)
        return None if w is None else w.state

    def set(self, wid: str, state: WorkerState) -> None:
        self.table[wid] = WorkerInfo(
            id=wid,
            region="mad",
            state=state,
            capacity=Resources(cpus=1, memory_mb=1),
            allocated=Resources.zero(),
        )


@pytest.fixture
async def view() -> AsyncIterator[tuple[ClusterView, ViewWorker, Workers]]:
    bus = MemoryTransport()
    worker = ViewWorker(bus, "w1")
    await worker.start()
    table = Workers()
    table.set("w1", WorkerState.UP)
    clock = ManualClock(T0 + 1000)
    v = ClusterView(bus, table, clock, sync_interval_s=3600, tick_s=0.01, request_timeout_s=1)
    await v.start()
    yield v, worker, table
    await v.close()


wait_for = eventually


async def test_anti_entropy_heals_a_missed_event(
    view: tuple[ClusterView, ViewWorker, Workers],
) -> None:
    v, worker, _ = view
    await wait_for(lambda: v.complete)
    worker.machines["m1"] = machine("m1", MachineState.STARTED, T0)
    await v.sync_round()  # the worker's digest differs once: maybe an event in flight
    assert v.store.machine_json("m1") is None
    await v.sync_round()  # twice: the view lists the worker
    assert v.store.machine_json("m1") is not None
    # the worker stops it, and the event is lost on the way
    worker.machines["m1"] = machine("m1", MachineState.STOPPED, T0 + 5)
    await v.sync_round()  # differs once: maybe an event in flight
    await v.sync_round()  # differs twice: re-listed
    body = v.store.machine_json("m1")
    assert body is not None and Machine.model_validate_json(body).state == MachineState.STOPPED
    # destroyed while nobody listened: gone after the next round
    del worker.machines["m1"]
    await v.sync_round()
    await v.sync_round()
    assert v.store.machine_json("m1") is None


async def test_a_large_cluster_is_compared_a_slice_of_workers_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(feed, "SYNC_SLICE", 2)
    bus = MemoryTransport()
    table = Workers()
    workers = [ViewWorker(bus, f"w{i}") for i in range(5)]
    for w in workers:
        await w.start()
        table.set(w.id, WorkerState.UP)
        w.machines[f"m-{w.id}"] = machine(f"m-{w.id}", MachineState.STARTED, T0, worker=w.id)
    v = ClusterView(bus, table, ManualClock(T0 + 1000), sync_interval_s=3600, tick_s=0.01)
    await v.start()
    await wait_for(lambda: v.complete)  # the first round lists every worker
    assert {Machine.model_validate_json(b).id for _, b in v.store.app_rows("web")} == {
        f"m-{w.id}" for w in workers
    }
    # Each worker was asked on its own subject (in slices), none on the all-workers one.
    assert all(set(w.asked) == {subjects.worker(w.id, "digest")} for w in workers)
    await v.close()


async def test_an_event_for_an_unknown_machine_fetches_it(
    view: tuple[ClusterView, ViewWorker, Workers],
) -> None:
    v, worker, _ = view
    await wait_for(lambda: v.complete)
    worker.machines["m9"] = machine("m9", MachineState.STARTED, T0 + 7)
    v.on_events([event("m9", MachineState.STARTED, T0 + 7)])
    await wait_for(lambda: v.store.machine_json("m9") is not None)
    assert v.events.since(0)[-1].machine_id == "m9"


async def test_a_worker_going_down_and_coming_back_is_an_event_and_a_resync(
    view: tuple[ClusterView, ViewWorker, Workers],
) -> None:
    v, _, table = view
    await wait_for(lambda: v.complete)
    table.set("w1", WorkerState.DOWN)
    await wait_for(lambda: any(e.state == WorkerState.DOWN for e in v.events.since(0)))
    table.set("w1", WorkerState.UP)
    await wait_for(lambda: [e.state for e in v.events.since(0)] == ["up", "down", "up"])
    await wait_for(lambda: v.complete)
    await v.resync()  # as after a NATS outage
    assert not v.complete
    await wait_for(lambda: v.complete)


async def heartbeat(bus: MemoryTransport, w: FakeWorker) -> None:
    beat = Heartbeat(worker=w.info(), seq=1, interval_s=w.interval_s)
    await bus.publish(subjects.heartbeat(w.region, w.id), beat.model_dump_json().encode())


async def test_lists_events_apps_and_regions_over_http() -> None:
    bus = MemoryTransport()
    workers = [FakeWorker(bus, "wa", cpus=2), FakeWorker(bus, "wb", cpus=2)]
    service = await started_service(bus, *workers)
    transport = httpx.ASGITransport(app=create_app(service), raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://souq") as http:
            r = await http.post(
                "/v1/apps/web/machines", json={"region": "mad", "config": {"cmd": ["x"]}}
            )
            assert r.status_code == 201, r.text
            mid = r.json()["id"]
            listed = await http.get("/v1/apps/web/machines", headers={"X-Request-Id": "abc"})
            assert listed.headers["X-Request-Id"] == "abc"
            assert [m["id"] for m in listed.json()] == [mid]
            assert listed.json()[0]["worker_state"] == "up"
            assert listed.headers["X-Souq-View"] in {"view", "workers"}
            stale = await http.get(f"/v1/apps/web/machines/{mid}?stale=true")
            assert stale.json()["id"] == mid and stale.headers["X-Souq-View"] == "view"
            listed = await http.get("/v1/apps")
            assert listed.headers["X-Souq-App-Records"] == "unavailable"  # no JetStream here
            (web,) = listed.json()["apps"]
            assert (web["name"], web["machines"], web["machine_count"]) == ("web", 1, 1)
            assert (web["states"], web["regions"]) == ({"started": 1}, ["mad"])
            assert (web["status"], web["explicit"], web["created_at"]) == ("deployed", False, None)
            (mad,) = (await http.get("/v1/regions?cpus=1&memory_mb=256")).json()
            assert (mad["name"], mad["workers_up"], mad["fits"]) == ("mad", 2, 3)
            metrics = (await http.get("/metrics")).text
            assert 'souq_placements_total{outcome="placed"} 1.0' in metrics
            assert 'souq_machines{state="started"} 1.0' in metrics
            assert 'souq_placement_seconds_count{phase="gather"} 1.0' in metrics
            assert "souq_worker_heartbeat_age_seconds{" in metrics
            assert "souq_view_lag_seconds" in metrics
            owner = next(w for w in workers if w.id == r.json()["worker_id"])
            await owner.set_state(mid, MachineState.STOPPED)
            await wait_for(lambda: service.view.events.last_seq > 0)
            text = (await http.get("/v1/events?app=web")).text
            assert f'"machine_id":"{mid}"' in text and text.startswith("id: ")
            assert "event: machine\n" in text
            last = int(text.strip().split("\n\n")[-1].split("\n")[0].removeprefix("id: "))
            again = await http.get("/v1/events", headers={"Last-Event-ID": str(last)})
            assert f'"machine_id":"{mid}"' not in again.text
            assert "event: gap" not in again.text
            # An id this broker never gave (another broker's): a gap, then what is held.
            other = await http.get("/v1/events", headers={"Last-Event-ID": str(last + 100)})
            head, _, rest = other.text.partition("\n\n")
            assert head.startswith("event: gap\ndata: ") and '"kind":"gap"' in head
            assert f'"machine_id":"{mid}"' in rest
    finally:
        await service.close()


def test_a_machines_events_in_one_message_are_applied_in_one_write() -> None:
    store = ViewStore()
    record = machine("m1", MachineState.STARTING, T0)
    launch = event("m1", MachineState.STARTING, T0, record=record)
    started = event("m1", MachineState.STARTED, T0 + 2)
    stale = event("m1", MachineState.CREATED, T0 - 5)
    assert store.apply_events([launch, started]) is True
    body = store.machine_json("m1")
    assert body is not None
    got = Machine.model_validate_json(body)
    assert got.state == MachineState.STARTED
    statuses = [MachineState.STARTED, MachineState.STARTING, MachineState.STARTING]
    assert [e.status for e in got.events] == statuses  # the record's launch, then the two
    assert store.apply_events([stale]) is False
    # The same events again (a re-sent batch) change nothing and are not listed twice.
    assert store.apply_events([started]) is False
    got = Machine.model_validate_json(store.machine_json("m1") or "")
    assert [e.status for e in got.events] == statuses
    assert store.apply_events([event("m9", MachineState.STARTED, T0)]) is None


def test_a_record_the_row_holds_is_not_decoded_again() -> None:
    """A launch event carries the machine's record; the broker that made the machine applied
    the claim's answer first, so the event's copy is left undecoded (a copy that would not
    even validate is never looked at), and a newer copy is decoded and taken."""
    store = ViewStore()
    record = machine("m1", MachineState.STARTING, T0)
    store.apply_machine(record)

    def launch(at: int, config: object) -> MachineEventNote:
        note = event("m1", MachineState.STARTING, at, record=record)
        body = json.loads(bytes(note.machine_json))
        body.update(config=config, updated_at=iso_from_ms(at))
        return msgspec.structs.replace(note, machine_json=msgspec.Raw(json.dumps(body).encode()))

    assert launch(T0, {"guest": "no such guest"}).record_version() == T0
    store.apply_events([launch(T0, {"guest": "no such guest"})])  # its event only
    assert Machine.model_validate_json(store.machine_json("m1") or "").config == record.config
    with pytest.raises(ValueError, match="guest"):
        store.apply_events([launch(T0 + 5, {"guest": "no such guest"})])
    assert store.apply_events([launch(T0 + 5, {"cmd": ["sleep", "2"]})]) is True
    got = Machine.model_validate_json(store.machine_json("m1") or "")
    assert got.config.cmd == ["sleep", "2"]


async def test_the_events_of_a_machine_this_broker_is_claiming_wait_for_the_answer(
    view: tuple[ClusterView, ViewWorker, Workers],
) -> None:
    """While this broker claims a create, its machine's launch event (and any later event)
    waits; the answer is applied first and the events after it, the record not decoded from
    the event. A claim that ends without an answer applies what waited, record and all."""
    v, worker, _ = view
    await wait_for(lambda: v.complete)
    asked = len(worker.asked)

    def made_by(mid: str, request_id: str, at: int) -> Machine:
        placement = Placement(request_id=request_id, region="mad")
        return machine(mid, MachineState.STARTING, at).model_copy(update={"placement": placement})

    answer = made_by("m5", "r5", T0 + 5)
    v.hold_launch("r5")
    v.on_events([event("m5", MachineState.STARTING, T0 + 5, record=answer)])
    v.on_events([event("m5", MachineState.STARTED, T0 + 6)])  # no record: waits too
    other = made_by("m7", "r7", T0 + 5)  # another broker's create: applied at once
    v.on_events([event("m7", MachineState.STARTING, T0 + 5, record=other)])
    assert v.store.machine_json("m5") is None and v.store.machine_json("m7") is not None
    assert [e.machine_id for e in v.events.since(0)][-3:] == ["m5", "m5", "m7"]  # told at once
    v.release("r5", answer)
    got = Machine.model_validate_json(v.store.machine_json("m5") or "")
    assert got.state == MachineState.STARTED and got.placement == answer.placement
    assert len(worker.asked) == asked  # nothing fetched from the worker

    unanswered = made_by("m6", "r6", T0 + 5)
    v.hold_launch("r6")
    v.on_events([event("m6", MachineState.STARTING, T0 + 5, record=unanswered)])
    v.release("r6")  # the claim failed at this broker, yet the worker made it
    assert Machine.model_validate_json(v.store.machine_json("m6") or "").id == "m6"
    v.on_events([event("m6", MachineState.STARTED, T0 + 9)])  # released: applied at once
    assert Machine.model_validate_json(v.store.machine_json("m6") or "").state.value == "started"


def test_a_record_this_process_answered_with_is_not_encoded_again() -> None:
    """The broker answers a create with the machine's JSON (machine_text) and then applies the
    same record to its view: the row is made of that text, and is what encoding it gives."""
    record = machine("m1", MachineState.STARTED, T0).model_copy(
        update={"placement": Placement(request_id="r1", region="mad")}
    )
    text = machine_text(record)
    assert text == record.model_dump_json() and machine_text(record) is text  # remembered
    store, fresh = ViewStore(), ViewStore()
    store.apply_machine(record)
    fresh.apply_machine(record.model_copy())  # an equal record not remembered: encoded
    assert store.machine_json("m1") == fresh.machine_json("m1")
    assert json.loads(store.machine_json("m1") or "") == json.loads(text)
