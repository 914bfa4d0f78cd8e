"""The agent's side of the market: offers, claims to the exact limit, reservations,
idempotency, heartbeats and events."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from souq.bus import subjects
from souq.bus.codec import decode, decode_one_or_many, encode, unwrap
from souq.errors import ClaimRefused, IdempotencyConflict
from souq.model import (
    ClaimRequest,
    DestroyCommand,
    Heartbeat,
    MachineConfig,
    MachineEventMessage,
    MachineState,
    Offer,
    OfferRequest,
    Placement,
    Resources,
    StopCommand,
    WorkerUsage,
)
from souq.protocol import verbs as v
from tests.integration.agent_harness import APP, Harness, eventually, load, running_agent

S = MachineState
SLEEPER = ["sleep", "60"]


async def ask_offer(h: Harness, cpus: float, memory_mb: int, request_id: str = "r1") -> Offer:
    req = OfferRequest(
        request_id=request_id,
        app=APP,
        region="mad",
        resources=Resources(cpus=cpus, memory_mb=memory_mb),
    )
    replies = await h.bus.gather(subjects.offers("mad"), encode(req), expect=1, timeout=5)
    assert len(replies) == 1
    return load(Offer, unwrap(replies[0]))


def test_offers_say_whether_and_why(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(
            nats_url, tmp_path, cpus=2, memory_mb=1024, labels={"disk": "ssd"}
        ) as h:
            offer = await ask_offer(h, 2, 1024)
            assert offer.eligible
            worker = offer.worker
            assert (worker.id, worker.region, worker.labels) == (
                h.worker_id,
                "mad",
                {"disk": "ssd"},
            )
            assert (worker.capacity.cpus, worker.capacity.memory_mb) == (2, 1024)
            assert worker.allocated == Resources.zero()
            assert worker.fingerprint is not None
            assert worker.fingerprint.cpus == 2
            assert worker.fingerprint.drivers[0] == "exec"  # and "sandbox" where bwrap works
            cpu = await ask_offer(h, 2.5, 10)
            assert (cpu.eligible, cpu.reason) == (False, "insufficient_cpu")
            assert "2.5 cpus" in (cpu.detail or "")
            memory = await ask_offer(h, 1, 2048)
            assert (memory.eligible, memory.reason) == (False, "insufficient_memory")
            assert "2048 MiB" in (memory.detail or "")
            m = await h.claim(SLEEPER, request_id="r-known", cpus=2, memory_mb=1024)
            full = await ask_offer(h, 0.5, 10)
            assert (full.eligible, full.reason) == (False, "insufficient_cpu")
            assert full.worker.allocated == Resources(cpus=2, memory_mb=1024)
            assert full.worker.machines == 1
            again = await ask_offer(h, 2, 1024, request_id="r-known")
            assert (again.eligible, again.existing_machine_id) == (True, m.id)

    asyncio.run(body())


def test_claims_fill_to_the_exact_limit_and_destroy_releases(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path, cpus=2, memory_mb=1024) as h:
            a = await h.claim(SLEEPER, cpus=1, memory_mb=512)
            b = await h.claim(SLEEPER, cpus=1, memory_mb=256, skip_launch=True)
            assert h.agent.executor.allocated == Resources(cpus=2, memory_mb=768)  # cpus full
            with pytest.raises(ClaimRefused) as info:
                await h.claim(SLEEPER, cpus=0.001, memory_mb=1)
            assert info.value.details["reason"] == "insufficient_cpu"
            assert info.value.http_status == 409
            await h.call(v.DESTROY, DestroyCommand(app=APP, machine_id=b.id))
            with pytest.raises(ClaimRefused) as info:
                await h.claim(SLEEPER, cpus=0.5, memory_mb=513)
            assert info.value.details["reason"] == "insufficient_memory"
            c = await h.claim(SLEEPER, cpus=1, memory_mb=512)  # exactly full again
            assert c.state is S.STARTED
            # A stopped machine keeps its reservation...
            await h.call(v.STOP, StopCommand(app=APP, machine_id=a.id))
            await h.wait(a.id, S.STOPPED)
            with pytest.raises(ClaimRefused):
                await h.claim(SLEEPER, cpus=0.5, memory_mb=10)
            # ...until it is destroyed.
            await h.call(v.DESTROY, DestroyCommand(app=APP, machine_id=a.id))
            d = await h.claim(SLEEPER, cpus=1, memory_mb=512)
            assert d.state is S.STARTED
            assert h.agent.executor.allocated == Resources(cpus=2, memory_mb=1024)
            assert h.agent.store.allocated() == h.agent.executor.allocated

    asyncio.run(body())


def test_claims_are_idempotent_on_the_request_id(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            first = await h.claim(SLEEPER, request_id="k1", body_hash="h1")
            again = await h.claim(SLEEPER, request_id="k1", body_hash="h1")
            assert again.id == first.id
            assert again.pid == first.pid
            assert len(h.agent.executor.list_machines(APP)) == 1
            with pytest.raises(IdempotencyConflict) as info:
                await h.claim(SLEEPER, request_id="k1", body_hash="h2")
            assert info.value.details["machine_id"] == first.id
            assert info.value.status == "idempotency_conflict"

    asyncio.run(body())


def test_a_claim_for_another_region_is_refused(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path, region="syd") as h:
            req = ClaimRequest(
                request_id="x",
                body_hash="x",
                app=APP,
                region="mad",
                config=MachineConfig(cmd=SLEEPER),
            )
            with pytest.raises(ClaimRefused) as info:
                await h.call(v.CLAIM, req)
            assert info.value.details["reason"] == "wrong_region"

    asyncio.run(body())


def test_heartbeats_discover_and_events(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        beats: list[Heartbeat] = []
        events: list[MachineEventMessage] = []

        async def on_beat(subject: str, data: bytes) -> None:
            beats.append(Heartbeat.model_validate_json(data))

        async def on_event(subject: str, data: bytes) -> None:
            events.extend(decode_one_or_many(data, MachineEventMessage))

        async with running_agent(nats_url, tmp_path, heartbeat_interval_s=60) as h:
            await h.bus.subscribe(subjects.heartbeat("mad", h.worker_id), on_beat)
            await h.bus.subscribe(subjects.events("mad", h.worker_id), on_event)
            await h.bus.flush()
            await h.bus.publish(subjects.DISCOVER, b"")
            beat = (await eventually(lambda: beats, message="a heartbeat"))[0]
            assert beat.worker.id == h.worker_id
            assert beat.interval_s == 60
            assert (beat.worker.capacity.cpus, beat.worker.capacity.memory_mb) == (4, 4096)
            m = await h.claim(SLEEPER, skip_launch=True)
            after_claim = len(beats)  # a beat sent before the claim may still arrive late
            await h.bus.publish(subjects.DISCOVER, b"")
            latest = await eventually(
                lambda: next((b for b in beats[after_claim:] if b.worker.allocated.cpus > 0), None),
                message="a beat that counts the claim",
            )
            assert latest.seq > beat.seq
            assert latest.worker.allocated == Resources(cpus=1, memory_mb=256)
            await h.call(v.DESTROY, DestroyCommand(app=APP, machine_id=m.id))
            await eventually(lambda: len(events) >= 3, message="three events")
            assert [(e.event.type, e.state) for e in events] == [
                ("launch", S.CREATED),
                ("destroy", S.DESTROYING),
                ("destroy", S.DESTROYED),
            ]
            assert {(e.machine_id, e.app, e.worker_id, e.region) for e in events} == {
                (m.id, APP, h.worker_id, "mad")
            }

    asyncio.run(body())


def test_heartbeats_flow_every_interval(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path, heartbeat_interval_s=0.05) as h:
            beats: list[int] = []

            async def on_beat(subject: str, data: bytes) -> None:
                beats.append(Heartbeat.model_validate_json(data).seq)

            await h.bus.subscribe(subjects.ALL_HEARTBEATS, on_beat)
            await eventually(lambda: len(beats) >= 3, message="three heartbeats")
            assert beats == sorted(beats)

    asyncio.run(body())


async def usage_heard(h: Harness) -> list[WorkerUsage]:
    """Every usage message the bus carries from now on, decoded, in the list returned."""
    told: list[WorkerUsage] = []

    async def on_usage(subject: str, data: bytes) -> None:
        told.append(decode(data, WorkerUsage))

    await h.bus.subscribe(subjects.ALL_USAGE, on_usage)
    await h.bus.flush()
    return told


def test_the_worker_tells_its_usage_when_a_claim_or_destroy_changes_it(
    nats_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path, cpus=2, memory_mb=1024) as h:
            told = await usage_heard(h)
            m = await h.claim(SLEEPER, cpus=1.5, memory_mb=256)
            claimed = await eventually(
                lambda: [u for u in told if u.allocated.cpus == 1.5], message="the usage"
            )
            assert claimed[-1].worker_id == h.worker_id
            assert claimed[-1].capacity.cpus == 2
            await h.call(v.DESTROY, DestroyCommand(app=APP, machine_id=m.id, force=True))
            freed = await eventually(
                lambda: [u for u in told if u.allocated.cpus == 0], message="the freed usage"
            )
            assert freed[-1].version > claimed[-1].version
            # Refused claims carry it too, so that a broker corrects its book at once.
            await h.claim(SLEEPER, cpus=1.5, memory_mb=256)
            with pytest.raises(ClaimRefused) as caught:
                await h.claim(SLEEPER, cpus=1, memory_mb=256)
            assert caught.value.details["usage"]["allocated"]["cpus"] == 1.5

    asyncio.run(body())


def test_a_claims_reply_leaves_out_the_record_it_brought_but_keeps_it(
    nats_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            record = Placement(request_id="r-rec", region="mad", winner=h.worker_id)
            req = ClaimRequest(
                request_id="r-rec",
                body_hash="h",
                app=APP,
                region="mad",
                config=MachineConfig(cmd=SLEEPER),
                placement=record,
            )
            made = await h.call(v.CLAIM, req)
            assert made.placement is None  # the caller has it: most of the reply's bytes
            stored = await h.get(made.id)
            assert stored.placement is not None and stored.placement.winner == h.worker_id
            again = await h.call(v.CLAIM, req)  # a retry: the machine as it was made
            assert again.id == made.id and again.placement == stored.placement

    asyncio.run(body())


def test_usage_says_what_lower_classes_could_free_and_a_preempting_refusal_carries_it(
    nats_url: str, tmp_path: Path
) -> None:
    """What a broker's book preempts from: per class below ``reserved``, what its settled
    machines reserve, how many, their lowest bid; and a preempting claim refused carries it,
    so that the book stops sending creates to room that went."""

    async def body() -> None:
        async with running_agent(nats_url, tmp_path, cpus=2, memory_mb=1024) as h:
            told = await usage_heard(h)
            await h.claim(SLEEPER, cpus=1, priority_class="spot", max_price=3)
            await h.claim(SLEEPER, cpus=1, priority_class="standard")
            said = await eventually(
                lambda: [u for u in told if u.preemptible and len(u.preemptible) == 2],
                message="the room of both classes",
            )
            spot, standard = said[-1].preemptible or []
            assert (spot.priority_class, spot.resources.cpus, spot.machines) == ("spot", 1, 1)
            assert spot.cheapest == 3
            assert (standard.priority_class, standard.machines, standard.cheapest) == (
                "standard",
                1,
                None,
            )
            # Two cpus for a standard machine: its one spot victim frees one. Refused, with the
            # worker's usage saying so.
            config = MachineConfig.model_validate(
                {"cmd": SLEEPER, "guest": {"cpus": 2, "memory_mb": 256}}
            )
            req = ClaimRequest(
                request_id="r-big", body_hash="h", app=APP, region="mad", config=config, preempt=8
            )
            with pytest.raises(ClaimRefused) as caught:
                await h.call(v.CLAIM, req)
            assert caught.value.details["reason"] == "no_preemptible"
            usage = WorkerUsage.model_validate(caught.value.details["usage"])
            assert [r.priority_class for r in usage.preemptible or []] == ["spot", "standard"]

    asyncio.run(body())
