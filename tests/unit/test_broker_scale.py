"""Sampling and batch creates: a broker against real agents (hollow driver, in-memory store) on
the in-memory bus."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import AsyncIterator

import pytest

from souq.agent.config import AgentConfig
from souq.agent.main import Agent
from souq.broker.config import BrokerConfig
from souq.broker.service import BrokerService
from souq.bus import MemoryTransport, encode, subjects, unwrap_as
from souq.errors import ClaimRefused, InsufficientCapacity, InvalidInput, Unavailable
from souq.fleet import HollowDriver
from souq.fleet.store import memory_store
from souq.market.sampling import plan_sample
from souq.model import MachineConfig, MachineState, Resources, WorkerUsage
from souq.model.batch import BatchClaimReply, BatchClaimRequest, BatchCreateRequest

from .broker_fakes import create_body

pytestmark = pytest.mark.anyio


def test_plan_sample_asks_everyone_up_to_the_threshold_then_a_seeded_sample() -> None:
    ids = [f"w{i:03d}" for i in range(100)]
    assert plan_sample("r1", ids[:64], above=64, factor_d=2, minimum=8).workers is None
    plan = plan_sample("r1", ids, above=64, factor_d=2, minimum=8)
    assert plan.workers is not None and len(plan.workers) == 8  # max(8, 2 x 1)
    assert plan.population == 100
    assert plan_sample("r1", ids, above=64, factor_d=2, minimum=8).workers == plan.workers
    assert plan_sample("r2", ids, above=64, factor_d=2, minimum=8).workers != plan.workers
    batch = plan_sample("r1", ids, machines=30, above=64, factor_d=2, minimum=8)
    assert batch.workers is not None and len(set(batch.workers)) == 60  # d x m
    everyone = plan_sample("r1", ids, machines=80, above=64, factor_d=2, minimum=8)
    assert everyone.workers is not None and sorted(everyone.workers) == ids  # capped at n


@contextlib.asynccontextmanager
async def hollow_cluster(
    workers: int, *, cpus: float = 2, memory_mb: int = 2048, **config: object
) -> AsyncIterator[tuple[BrokerService, list[Agent]]]:
    bus = MemoryTransport()
    driver = HollowDriver()
    agents = []
    for _ in range(workers):
        agent = Agent(
            AgentConfig(region="mad", nats_url="-", cpus=cpus, memory_mb=memory_mb),
            transport=bus,
            store=memory_store(),
            driver=driver,
        )
        await agent.start()
        agents.append(agent)
    service = BrokerService(bus, BrokerConfig(nats_url="-", **config))  # type: ignore[arg-type]
    await service.start()
    assert await service.liveness.wait_workers(workers, timeout=5.0)
    try:
        yield service, agents
    finally:
        await service.close()
        for agent in agents:
            await agent.aclose()
        await bus.close()


def batch(count: int, cpus: float = 1, **extra: object) -> BatchCreateRequest:
    return BatchCreateRequest.model_validate_json(
        json.dumps(
            {
                "region": "mad",
                "count": count,
                "config": {"cmd": ["serve"], "guest": {"cpus": cpus, "memory_mb": 64}},
                **extra,
            }
        )
    )


async def test_past_the_threshold_the_broker_asks_a_sample_and_says_so() -> None:
    async with hollow_cluster(12, sample_above=4, sample_min=3) as (service, _):
        machine = await service.create_machine("web", create_body(cpus=1))
        record = machine.placement
        assert record is not None and record.sampled is not None
        assert (record.sampled.asked, record.sampled.of) == (3, 12)
        assert (record.expected_offers, record.offers_received) == (3, 3)
        assert record.winner == machine.worker_id
        assert machine.state == MachineState.STARTED


async def test_at_or_below_the_threshold_everyone_is_asked() -> None:
    async with hollow_cluster(4, sample_above=4) as (service, _):
        machine = await service.create_machine("web", create_body(cpus=1))
        assert machine.placement is not None
        assert machine.placement.sampled is None
        assert machine.placement.offers_received == 4


async def test_a_batch_fills_workers_greedily_and_never_overfills() -> None:
    async with hollow_cluster(10, sample_above=4, sample_min=4) as (service, agents):
        result = await service.create_batch("web", batch(8))
        assert result.placed == 8
        assert len({m.id for m in result.machines}) == 8
        record = result.placement
        # d x m / slots: 2 x 8 machines / 2 per worker = 8 workers asked
        assert record.sampled is not None and record.sampled.asked == 8
        assert sum(record.assignments.values()) == 8
        assert all(n <= 2 for n in record.assignments.values())  # 2 cpus per worker
        for agent in agents:
            assert agent.executor.allocated.cpus <= 2
        # Each machine keeps its worker's share of the record.
        first = result.machines[0]
        assert first.placement is not None and first.placement.winner == first.worker_id


async def test_a_batch_is_all_or_nothing_by_default_and_partial_with_min_count() -> None:
    async with hollow_cluster(3, sample_above=64) as (service, agents):  # 6 cpus in all
        with pytest.raises(InsufficientCapacity) as err:
            await service.create_batch("web", batch(7))
        assert "fewer than min_count 7" in err.value.message
        assert all(a.executor.allocated.cpus == 0 for a in agents)  # the 6 made were undone
        result = await service.create_batch("web", batch(7, min_count=2))
        assert result.placed == 6
        assert result.unplaced and result.unplaced[0] == "1 of 7 not placed"
        with pytest.raises(InvalidInput):
            await service.create_batch("web", batch(2, min_count=3))


async def test_a_batch_claim_is_atomic_and_idempotent_on_the_worker() -> None:
    async with hollow_cluster(1, sample_above=64) as (service, [agent]):
        bus = service._transport
        config = MachineConfig(cmd=["serve"], guest={"cpus": 1, "memory_mb": 64})  # type: ignore[arg-type]

        def claim(*ids: str) -> bytes:
            return encode(
                BatchClaimRequest(
                    request_id="b1",
                    body_hash="h",
                    app="web",
                    region="mad",
                    config=config,
                    request_ids=list(ids),
                )
            )

        subject = subjects.worker(agent.worker_id, "claim_batch")
        with pytest.raises(ClaimRefused):  # three do not fit in 2 cpus: none is made
            unwrap_as(await bus.request(subject, claim("a", "b", "c"), 5), BatchClaimReply)
        assert agent.executor.machine_count() == 0
        made = unwrap_as(await bus.request(subject, claim("a", "b"), 5), BatchClaimReply)
        again = unwrap_as(await bus.request(subject, claim("a", "b"), 5), BatchClaimReply)
        assert [m.id for m in again.machines] == [m.id for m in made.machines]
        assert agent.executor.machine_count() == 2


async def test_the_hollow_driver_runs_until_signalled() -> None:
    from souq.drivers.base import MachineSpec

    driver = HollowDriver()
    spec = MachineSpec("m1", "web", "mad", "w1", ("serve",), {})
    handle = driver.start(spec)
    assert driver.inspect(handle)
    assert driver.signal(handle, signal.SIGWINCH)  # harmless: it still runs
    assert driver.inspect(handle)
    status = await driver.stop(handle, signal.SIGINT, timeout_s=5)  # it exits at once
    assert status.signal == "SIGINT"
    assert not driver.inspect(handle)
    assert not driver.signal(handle, signal.SIGKILL)
    assert driver.read_output("m1", 0, 100) == (b"", 0)


async def test_a_stale_book_costs_refused_claims_and_the_machines_go_elsewhere() -> None:
    async with hollow_cluster(12, sample_above=4, sample_min=2) as (service, agents):
        # Six workers filled behind the broker's back, and a book that still thinks them empty
        # (as a broker that missed their usage would): their claims are refused, each refusal
        # corrects the book, and the machines are drawn again elsewhere.
        full = agents[:6]
        for agent in full:
            agent.executor.admission.reserve(Resources(cpus=2, memory_mb=0))
            service.book.observe_usage(
                WorkerUsage(
                    worker_id=agent.worker_id,
                    region="mad",
                    capacity=Resources(cpus=2, memory_mb=2048),
                    allocated=Resources.zero(),
                    version=0,
                )
            )
        result = await service.create_batch("web", batch(8))
        assert result.placed == 8
        record = result.placement
        assert record.source == "book"
        assert record.sampled is not None and record.sampled.asked > 2
        refused = [c for c in record.claims if not c.ok]
        assert refused and {c.worker_id for c in refused} <= {a.worker_id for a in full}
        assert all(a.executor.allocated.cpus <= 2 for a in agents)
        assert all(
            service.book.allocated(a.worker_id) == a.executor.allocated
            for a in full
            if a.worker_id in {c.worker_id for c in refused}
        )


async def test_batches_take_turns_and_one_that_waits_too_long_is_told_to_retry() -> None:
    config = {"batch_concurrency": 1, "batch_admission_timeout_s": 0.05}
    async with hollow_cluster(2, **config) as (service, _):
        turns = service.market._turns
        await turns.acquire()  # another batch is being placed
        with pytest.raises(Unavailable, match="busy placing other batches") as caught:
            await service.create_batch("web", batch(1))
        assert caught.value.status == "unavailable"
        turns.release()  # its turn comes: placed, and the turn is handed back
        assert (await service.create_batch("web", batch(1))).placed == 1
        assert not turns.locked()
