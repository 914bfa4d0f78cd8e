"""The hollow fleet's heap policy (souq.fleet.heap): survivors of a collection are frozen, which
is safe because a claim leaves no reference cycle behind."""

from __future__ import annotations

import asyncio
import gc
import json

from souq.agent.config import AgentConfig
from souq.agent.main import Agent
from souq.bus import MemoryTransport
from souq.fleet.driver import HollowDriver
from souq.fleet.heap import SurvivorFreezer
from souq.fleet.store import memory_store


def test_the_survivors_of_a_collection_are_frozen() -> None:
    freezer = SurvivorFreezer()
    try:
        freezer.install()
        before = gc.get_freeze_count()
        assert before > 0  # what exists at start
        kept = [[n] for n in range(1000)]  # containers the collector tracks
        gc.collect(0)
        # Scanned once, never again: frozen, they are in none of the collector's generations.
        # (The freeze count alone would not tell: what was frozen earlier and freed since by its
        # reference count leaves it.)
        ids = {id(x) for x in kept}
        assert not [o for g in (0, 1, 2) for o in gc.get_objects(g) if id(o) in ids]
        freezer.uninstall()
        assert freezer._collected not in gc.callbacks
    finally:
        freezer.uninstall()
        gc.unfreeze()


def test_claims_leave_no_reference_cycle() -> None:
    """What the fleet freezes can never be garbage; a cycle would stay in memory."""

    async def claims() -> int:
        bus = MemoryTransport()
        agent = Agent(
            AgentConfig(region="mad", nats_url="-", cpus=64, memory_mb=65536),
            transport=bus,
            store=memory_store(),
            driver=HollowDriver(),
        )
        await agent.start()
        subject = f"souq.worker.{agent.worker_id}.claim"
        body = {"app": "web", "region": "mad", "config": {"cmd": ["serve"]}}

        async def flushed() -> None:
            assert agent._service is not None
            await agent._service.publisher.flush()

        async def claim(n: int) -> None:
            data = json.dumps({**body, "request_id": f"r{n}", "body_hash": f"r{n}"}).encode()
            assert (await bus.request(subject, data, 5)).startswith(b'{"ok":true')

        try:
            for n in range(5):  # the first claims warm caches up
                await claim(n)
            await flushed()
            gc.collect()
            gc.disable()
            for n in range(5, 55):
                await claim(n)
            await flushed()  # their events are published
            return gc.collect()
        finally:
            gc.enable()
            await agent.aclose()
            await bus.close()

    assert asyncio.run(claims()) == 0
