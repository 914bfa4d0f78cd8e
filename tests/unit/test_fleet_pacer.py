"""The hollow fleet's one publishing schedule (souq.fleet.pacer), on virtual time: every worker
beats once per interval, a claim's events and usage leave one linger after it in one message
each, and what waits through an outage leaves when the bus is back."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable

from souq.agent.config import AgentConfig
from souq.agent.main import Agent
from souq.agent.publisher import EVENTS_LINGER_S
from souq.bus import MemoryTransport
from souq.clock import VirtualClock
from souq.fleet.driver import HollowDriver
from souq.fleet.pacer import FleetPacer
from souq.fleet.store import memory_store
from souq.virtual_loop import run_virtual

INTERVAL_S = 2.0
WORKERS = 10

Heard = list[tuple[float, str]]  # (virtual time, subject) of each message published
Body = Callable[[MemoryTransport, FleetPacer, list[Agent], Heard], Awaitable[None]]


def with_fleet(body: Body) -> None:
    clock = VirtualClock()

    async def main() -> None:
        bus = MemoryTransport()
        heard: Heard = []

        async def record(subject: str, data: bytes) -> None:
            heard.append((clock.monotonic(), subject))

        for subject in ("souq.hb.>", "souq.evt.>", "souq.use.>"):
            await bus.subscribe(subject, record)
        pacer = FleetPacer(interval_s=INTERVAL_S)
        pacer.start()
        driver = HollowDriver()
        agents = []
        config = AgentConfig(
            region="mad", nats_url="-", cpus=4, memory_mb=4096, heartbeat_interval_s=INTERVAL_S
        )
        for _ in range(WORKERS):
            agent = Agent(config, transport=bus, store=memory_store(), driver=driver, pacer=pacer)
            await agent.start()
            agents.append(agent)
        try:
            await body(bus, pacer, agents, heard)
        finally:
            for agent in agents:
                await agent.aclose()
            await pacer.aclose()
            await bus.close()

    run_virtual(main(), clock=clock)


def claim(request_id: str) -> bytes:
    return json.dumps(
        {
            "request_id": request_id,
            "body_hash": request_id,
            "app": "web",
            "region": "mad",
            "config": {"cmd": ["serve"], "guest": {"cpus": 0.5, "memory_mb": 64}},
        }
    ).encode()


def test_every_worker_beats_once_per_interval() -> None:
    async def body(
        bus: MemoryTransport, pacer: FleetPacer, agents: list[Agent], heard: Heard
    ) -> None:
        await asyncio.sleep(0.01)
        heard.clear()  # the heartbeats each agent sends as it starts
        await asyncio.sleep(10 * INTERVAL_S)
        beats = Counter(subject for _, subject in heard if subject.startswith("souq.hb."))
        assert len(beats) == WORKERS
        assert set(beats.values()) <= {9, 10, 11}  # once per interval, give or take a tick
        assert sum(beats.values()) in range(10 * WORKERS - 2, 10 * WORKERS + 2)
        # A worker that leaves is not heard of again.
        gone = agents.pop()
        await gone.aclose()
        heard.clear()
        await asyncio.sleep(3 * INTERVAL_S)
        assert not any(gone.worker_id in subject for _, subject in heard)

    with_fleet(body)


def test_a_claims_events_and_usage_leave_one_linger_later() -> None:
    async def body(
        bus: MemoryTransport, pacer: FleetPacer, agents: list[Agent], heard: Heard
    ) -> None:
        await asyncio.sleep(0.01)
        heard.clear()
        loop = asyncio.get_running_loop()
        first, second = agents[0], agents[1]
        at = loop.time()
        for n, agent in enumerate((first, second, first)):
            reply = await bus.request(f"souq.worker.{agent.worker_id}.claim", claim(f"r{n}"), 5)
            assert reply.startswith(b'{"ok":true')
        await asyncio.sleep(0.1)
        sent = [(t - at, s) for t, s in heard if not s.startswith("souq.hb.")]
        for agent in (first, second):  # one message of events, then one usage, for each
            mine = [(t, s) for t, s in sent if s.endswith(agent.worker_id)]
            assert [s.split(".")[1] for _, s in mine] == ["evt", "use"]
            assert all(t >= EVENTS_LINGER_S for t, _ in mine)
            assert all(t < EVENTS_LINGER_S + 0.01 for t, _ in mine)

    with_fleet(body)


def test_events_wait_through_an_outage() -> None:
    async def body(
        bus: MemoryTransport, pacer: FleetPacer, agents: list[Agent], heard: Heard
    ) -> None:
        await asyncio.sleep(0.01)
        agent = agents[0]
        reply = await bus.request(f"souq.worker.{agent.worker_id}.claim", claim("r1"), 5)
        assert reply.startswith(b'{"ok":true')
        await bus.set_connected(False)  # before the linger is over
        heard.clear()
        await asyncio.sleep(5 * INTERVAL_S)
        assert heard == []  # no heartbeats, no events while the bus is down
        await bus.set_connected(True)
        await asyncio.sleep(0.1)
        mine = [s.split(".")[1] for _, s in heard if s.endswith(agent.worker_id)]
        # It announces itself (its heartbeat tells its usage too), then sends what waited.
        assert mine == ["hb", "evt"]

    with_fleet(body)
