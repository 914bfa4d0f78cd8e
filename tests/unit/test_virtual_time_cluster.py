"""The real broker and real hollow agents on the in-memory bus, on virtual time: an hour of
heartbeats passes in well under a second of wall time, and a worker that falls silent is
declared down after exactly its missed heartbeats, not after a wait."""

from __future__ import annotations

import asyncio
import json
import time

from souq.agent.config import AgentConfig
from souq.agent.main import Agent
from souq.broker.config import BrokerConfig
from souq.broker.schemas import CreateMachineRequest
from souq.broker.service import BrokerService
from souq.bus import MemoryTransport
from souq.clock import VirtualClock
from souq.fleet.driver import HollowDriver
from souq.fleet.store import memory_store
from souq.model import MachineState, WorkerState
from souq.virtual_loop import run_virtual


def body(cpus: float = 1) -> CreateMachineRequest:
    return CreateMachineRequest.model_validate_json(
        json.dumps(
            {
                "region": "mad",
                "config": {"cmd": ["serve"], "guest": {"cpus": cpus, "memory_mb": 64}},
            }
        )
    )


async def cluster_for_an_hour(clock: VirtualClock) -> dict[str, object]:
    bus = MemoryTransport()
    driver = HollowDriver()
    agents = []
    for _ in range(3):
        agent = Agent(
            AgentConfig(region="mad", nats_url="-", cpus=16, memory_mb=4096),
            transport=bus,
            store=memory_store(),
            driver=driver,
            clock=clock,
        )
        await agent.start()
        agents.append(agent)
    service = BrokerService(bus, BrokerConfig(nats_url="-"), clock=clock)
    await service.start()
    try:
        assert await service.liveness.wait_workers(3, timeout=5)
        machines = [await service.create_machine("web", body()) for _ in range(9)]
        assert all(m.state is MachineState.STARTED for m in machines)
        assert all(m.placement is not None and m.placement.source == "book" for m in machines)

        started = clock.monotonic()
        await asyncio.sleep(3600)  # an hour of heartbeats, usage and anti-entropy rounds
        hour = clock.monotonic() - started
        assert {w.state for w in service.liveness.workers()} == {WorkerState.UP}

        # One agent goes silent (as if its host froze): no more heartbeats or answers.
        silent = agents.pop()
        await silent.aclose()
        went_silent = clock.monotonic()
        while service.liveness.state_of(silent.worker_id) != WorkerState.DOWN:
            await asyncio.sleep(0.1)
        down_after = clock.monotonic() - went_silent

        # New machines avoid it: the book draws only live workers.
        more = [await service.create_machine("web", body()) for _ in range(6)]
        assert silent.worker_id not in {m.worker_id for m in more}
        return {"hour": hour, "down_after": down_after}
    finally:
        await service.close()
        for agent in agents:
            await agent.aclose()
        await bus.close()


def test_a_cluster_runs_an_hour_of_virtual_time_in_a_moment() -> None:
    clock = VirtualClock()
    wall = time.monotonic()
    result = run_virtual(cluster_for_an_hour(clock), clock=clock)
    assert time.monotonic() - wall < 30  # real time: the hour itself is virtual
    assert result["hour"] == 3600
    # Down once three heartbeat intervals (1 s) passed since its last heartbeat, which came at
    # most one interval before it fell silent: 2 to 3 s of virtual time after.
    down_after = result["down_after"]
    assert isinstance(down_after, float) and 2.0 < down_after <= 3.1
