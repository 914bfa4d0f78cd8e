"""The market against fake workers on the in-memory bus: solicit, rank, claim, explain."""

from __future__ import annotations

import asyncio

import pytest

from souq.bus import MemoryTransport
from souq.errors import IdempotencyConflict, InsufficientCapacity, Unavailable, UnknownRegion
from souq.model import MachineState, Placement, Resources
from souq.model.reasons import Reason

from .broker_fakes import FakeWorker, create_body, started_service

pytestmark = pytest.mark.anyio


async def test_places_on_the_best_offer_and_explains_why() -> None:
    bus = MemoryTransport()
    half = FakeWorker(bus, "whalf", allocated=Resources(cpus=1, memory_mb=1024))
    empty = FakeWorker(bus, "wempty")
    service = await started_service(bus, half, empty)

    machine = await service.create_machine("web", create_body(cpus=1, memory_mb=1024))

    assert machine.worker_id == "whalf"
    assert machine.state == MachineState.STARTED
    record = machine.placement
    assert record is not None
    assert record.region == "mad"
    assert record.policy == "best-fit"
    assert (record.expected_offers, record.offers_received) == (2, 2)
    assert (record.winner, record.runner_up) == ("whalf", "wempty")
    assert [(c.worker_id, c.ok) for c in record.claims] == [("whalf", True)]
    assert [o.worker_id for o in record.offers] == ["whalf", "wempty"]
    assert record.timings.total_ms >= record.timings.gather_ms >= 0
    # The worker stored the record with the machine (claim carried it).
    stored = half.claims[0].placement
    assert stored is not None and stored.winner == "whalf"
    assert stored.request_id == half.claims[0].request_id


async def test_a_refused_claim_falls_back_to_the_next_offer() -> None:
    bus = MemoryTransport()
    racer = FakeWorker(bus, "wracer", allocated=Resources(cpus=2, memory_mb=2048))
    racer.refuse_claims = True
    spare = FakeWorker(bus, "wspare")
    service = await started_service(bus, racer, spare)

    machine = await service.create_machine("web", create_body())

    assert machine.worker_id == "wspare"
    record = machine.placement
    assert record is not None
    assert [(c.worker_id, c.ok, c.reason) for c in record.claims] == [
        ("wracer", False, "claim_refused"),
        ("wspare", True, None),
    ]
    assert record.winner == "wspare"
    assert record.runner_up == "wracer"


async def test_a_worker_gone_from_the_bus_is_skipped_like_a_refusal() -> None:
    """A claim that reaches nobody (the worker's subscription is gone) made nothing: the next
    worker takes the machine."""
    bus = MemoryTransport()
    gone = FakeWorker(bus, "wgone", allocated=Resources(cpus=2, memory_mb=2048))
    spare = FakeWorker(bus, "wspare")
    service = await started_service(bus, gone, spare)
    await gone.stop()  # the broker still holds it live: it has not missed a heartbeat yet

    machine = await service.create_machine("web", create_body())

    assert machine.worker_id == "wspare"
    assert machine.placement is not None
    assert machine.placement.claims[0].reason == "unavailable"


async def test_an_unanswered_claim_is_never_made_on_another_worker() -> None:
    """A worker that hears the claim and never answers may have made the machine: the claim
    is sent to it once more, then the create is unavailable naming it; the spare worker, which
    would have made a second machine, is never claimed on."""
    bus = MemoryTransport()
    mute = FakeWorker(bus, "wmute", allocated=Resources(cpus=2, memory_mb=2048))
    mute.silent_claims = True
    spare = FakeWorker(bus, "wspare")
    service = await started_service(bus, mute, spare, claim_timeout_s=0.05, claim_patience_s=0.2)

    with pytest.raises(Unavailable) as caught:
        await service.create_machine("web", create_body())

    assert caught.value.http_status == 503
    assert "wmute" in caught.value.message and "may have been made" in caught.value.message
    assert len(mute.claims) >= 2  # sent again while it is heard, then once more
    assert {c.request_id for c in mute.claims} == {mute.claims[0].request_id}
    assert spare.claims == []


async def test_a_slow_claim_on_a_worker_still_heard_is_sent_again_not_given_up() -> None:
    bus = MemoryTransport()
    # The busy worker is the best fit (fuller); its first claim is answered past the deadline.
    busy = FakeWorker(bus, "wbusy", allocated=Resources(cpus=2, memory_mb=2048), slow_claims=300)
    spare = FakeWorker(bus, "wspare")
    service = await started_service(bus, busy, spare, claim_timeout_s=0.1)

    machine = await service.create_machine("web", create_body())

    # The claim went to the same worker again (it is idempotent per request id), whose answer
    # names the machine the first one made: one machine, where it was claimed, none elsewhere.
    assert machine.worker_id == "wbusy"
    assert len(busy.claims) == 2
    assert {c.request_id for c in busy.claims} == {busy.claims[0].request_id}
    assert len(busy.machines) == 1
    assert spare.claims == []
    assert machine.placement is not None
    assert [c.ok for c in machine.placement.claims] == [True]


async def test_refused_claims_go_down_the_ranking_then_capacity_is_refused() -> None:
    bus = MemoryTransport()
    racers = [FakeWorker(bus, f"w{i}", refuse_claims=True) for i in range(3)]
    # (no preemption: it would ask the same workers again, whom they would displace)
    service = await started_service(bus, *racers, max_claim_attempts=2, preempt_max_victims=0)

    with pytest.raises(InsufficientCapacity) as caught:
        await service.create_machine("web", create_body())

    err = caught.value
    assert err.http_status == 409
    # A refusal (another broker won the race) is cheap: every offer is tried.
    assert "3 claims refused" in err.message
    record = Placement.model_validate(err.details["placement"])
    assert len(record.claims) == 3
    assert not any(c.ok for c in record.claims)
    assert record.winner is None
    assert sum(len(w.claims) for w in racers) == 3


async def test_claims_refused_for_an_unknown_network_are_unavailable_not_no_capacity() -> None:
    """While the broker cannot read the app's network (JetStream down), private-network workers
    refuse the claim (``network_unknown``): that is 503, retry, not 409; one refusal of another
    kind beside them keeps the 409."""
    bus = MemoryTransport()
    workers = [
        FakeWorker(bus, f"w{i}", refuse_claims=True, refusal_reason=Reason.NETWORK_UNKNOWN)
        for i in range(2)
    ]
    service = await started_service(bus, *workers, preempt_max_victims=0)
    with pytest.raises(Unavailable) as caught:
        await service.create_machine("web", create_body())
    assert caught.value.http_status == 503
    assert "private network cannot be read" in caught.value.message
    record = Placement.model_validate(caught.value.details["placement"])
    assert [c.reason for c in record.claims] == [Reason.NETWORK_UNKNOWN, Reason.NETWORK_UNKNOWN]

    bus = MemoryTransport()
    mixed = [
        FakeWorker(bus, "w0", refuse_claims=True, refusal_reason=Reason.NETWORK_UNKNOWN),
        FakeWorker(bus, "w1", refuse_claims=True),
    ]
    service = await started_service(bus, *mixed, preempt_max_victims=0)
    with pytest.raises(InsufficientCapacity):
        await service.create_machine("web", create_body())


async def test_insufficient_capacity_names_the_reasons_with_counts() -> None:
    bus = MemoryTransport()
    small = [FakeWorker(bus, f"w{i}", cpus=2) for i in range(2)]
    cordoned = FakeWorker(bus, "wc", cordoned=True)
    service = await started_service(bus, *small, cordoned)

    with pytest.raises(InsufficientCapacity) as caught:
        await service.create_machine("web", create_body(cpus=4))

    err = caught.value
    # The fake says "full" itself when it cannot fit the machine: its reason is kept.
    assert err.message == "no worker in region mad can take 4 cpus / 256 MiB: 1 cordoned, 2 full"
    assert err.hint
    body = err.to_body()
    assert body["status"] == "insufficient_capacity"
    record = body["placement"]
    assert record["expected_offers"] == 3
    assert record["offers_received"] == 3
    assert record["rejections"] == {"full": 2, "cordoned": 1}
    assert record["claims"] == []
    assert all(w.claims == [] for w in small)


async def test_broker_side_filter_counts_insufficient_cpu() -> None:
    bus = MemoryTransport()
    worker = FakeWorker(bus, "w1", cpus=2)
    service = await started_service(bus, worker)

    async def eager(subject: str, data: bytes) -> bytes | None:
        # A worker that offers without checking: the broker's filter rejects it by name.
        from souq.bus import ok_reply
        from souq.model import Offer

        return ok_reply(Offer(worker=worker.info(), eligible=True))

    worker.bus._subs = [s for s in bus._subs if s.pattern != "souq.offers.mad"]
    await bus.subscribe("souq.offers.mad", eager)

    with pytest.raises(InsufficientCapacity) as caught:
        await service.create_machine("web", create_body(cpus=4))
    assert "1 insufficient_cpu" in caught.value.message
    assert caught.value.details["placement"]["rejections"] == {"insufficient_cpu": 1}


async def test_missing_offers_are_counted_in_the_record() -> None:
    bus = MemoryTransport()
    quiet = FakeWorker(bus, "wquiet", silent_offers=True)
    full = FakeWorker(bus, "wfull", cpus=0.5)
    service = await started_service(bus, quiet, full, candidates_from="offers")

    with pytest.raises(InsufficientCapacity) as caught:
        await service.create_machine("web", create_body())
    assert "1 full, 1 did not answer" in caught.value.message
    record = caught.value.details["placement"]
    assert (record["expected_offers"], record["offers_received"]) == (2, 1)


async def test_a_region_whose_workers_are_all_down_has_no_capacity() -> None:
    bus = MemoryTransport()
    worker = FakeWorker(bus, "w1", interval_s=1.0)
    service = await started_service(bus, worker)
    clock = service.liveness._clock
    await worker.stop()
    clock.advance(3.5)  # type: ignore[attr-defined]

    with pytest.raises(InsufficientCapacity) as caught:
        await service.create_machine("web", create_body())
    # saying which workers are down (a crash, or a partition between them and the broker)
    assert caught.value.message == "no live workers in region mad: w1 is down (no heartbeat heard)"
    assert caught.value.details["placement"]["expected_offers"] == 0


async def test_an_unknown_region_names_the_known_ones() -> None:
    bus = MemoryTransport()
    service = await started_service(
        bus, FakeWorker(bus, "w1", region="mad"), FakeWorker(bus, "w2", region="syd")
    )
    with pytest.raises(UnknownRegion) as caught:
        await service.create_machine("web", create_body(region="atlantis"))
    assert caught.value.http_status == 422
    assert "'atlantis'" in caught.value.message
    assert "mad, syd" in caught.value.message


async def test_an_unknown_region_with_no_workers_at_all() -> None:
    bus = MemoryTransport()
    service = await started_service(bus)
    with pytest.raises(UnknownRegion, match="no worker has announced itself"):
        await service.create_machine("web", create_body(region="mad"))


async def test_a_region_heard_only_through_offers_is_placed_in() -> None:
    # A broker that has not had a heartbeat yet still asks the region: whoever answers counts.
    bus = MemoryTransport()
    worker = await FakeWorker(bus, "w1").start()
    service = await started_service(bus)
    service.liveness._workers.clear()
    machine = await service.create_machine("web", create_body())
    assert machine.worker_id == "w1"
    assert worker.claims


async def test_an_idempotent_retry_returns_the_same_machine() -> None:
    bus = MemoryTransport()
    a, b = FakeWorker(bus, "wa"), FakeWorker(bus, "wb")
    service = await started_service(bus, a, b)

    first = await service.create_machine("web", create_body(), idempotency_key="k1")
    again = await service.create_machine("web", create_body(), idempotency_key="k1")

    assert again.id == first.id
    assert len(a.machines) + len(b.machines) == 1
    other_app = await service.create_machine("api", create_body(), idempotency_key="k1")
    assert other_app.id != first.id  # the key is scoped by app

    with pytest.raises(IdempotencyConflict):
        await service.create_machine("web", create_body(cpus=2), idempotency_key="k1")


async def test_concurrent_identical_keys_share_one_placement() -> None:
    bus = MemoryTransport()
    worker = FakeWorker(bus, "w1")
    service = await started_service(bus, worker)

    results = await asyncio.gather(
        *(service.create_machine("web", create_body(), idempotency_key="same") for _ in range(5))
    )

    assert {m.id for m in results} == {results[0].id}
    assert worker.offer_requests == 1
    assert len(worker.claims) == 1
    assert service._creates.running() == 0


async def test_concurrent_same_key_with_another_body_conflicts() -> None:
    bus = MemoryTransport()
    worker = FakeWorker(bus, "w1")
    service = await started_service(bus, worker)
    first = asyncio.ensure_future(service.create_machine("web", create_body(), idempotency_key="k"))
    await asyncio.sleep(0)  # let the first one register
    with pytest.raises(IdempotencyConflict, match="different body"):
        await service.create_machine("web", create_body(cpus=2), idempotency_key="k")
    assert (await first).worker_id == "w1"


async def test_equivalent_bodies_hash_alike() -> None:
    from souq.broker.idempotency import body_hash

    spelled_out = create_body(cpus=1, memory_mb=256)
    assert body_hash(spelled_out) == body_hash(create_body())
    assert body_hash(create_body(cpus=2)) != body_hash(create_body())
