"""What a worker's offer tells placement beyond capacity: its measured load, its artifact cache,
how many machines of the asking app it runs; and its disk and gpus in the fingerprint."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path

import httpx

from souq.bus import subjects
from souq.bus.codec import encode, unwrap
from souq.errors import ClaimRefused
from souq.model import DestroyCommand, Offer, OfferRequest, Resources
from souq.natsserver import free_port
from souq.protocol import verbs as v
from tests.integration.agent_harness import APP, Harness, load, running_agent

SLEEPER = ["sleep", "60"]


async def ask_offer(h: Harness, app: str = APP, **want: int) -> Offer:
    req = OfferRequest(
        request_id="r-offer",
        app=app,
        region="mad",
        resources=Resources(cpus=want.get("cpus", 1), memory_mb=256, disk_mb=want.get("disk", 0)),
    )
    replies = await h.bus.gather(subjects.offers("mad"), encode(req), expect=1, timeout=5)
    assert len(replies) == 1
    return load(Offer, unwrap(replies[0]))


def test_offers_carry_load_artifacts_and_the_apps_machines(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            offer = await ask_offer(h)
            assert offer.load is not None
            assert 0 <= offer.load.cpu_percent <= 100
            assert 0 < offer.load.memory_percent <= 100
            assert offer.load.memory_used_mb > 0
            assert (offer.artifacts, offer.app_machines) == ([], 0)

            a = await h.claim(SLEEPER, skip_launch=True, artifact="registry.example/web:1")
            await h.claim(SLEEPER, skip_launch=True, artifact="sha256:abc")
            await h.claim(SLEEPER, skip_launch=True, app="other", artifact="registry.example/web:1")
            offer = await ask_offer(h)
            assert offer.app_machines == 2
            assert offer.artifacts == ["registry.example/web:1", "sha256:abc"]  # newest first
            assert (await ask_offer(h, app="other")).app_machines == 1

            # Destroyed machines leave the count, but their artifacts stay cached.
            await h.call(v.DESTROY, DestroyCommand(app=APP, machine_id=a.id, force=True))
            offer = await ask_offer(h)
            assert offer.app_machines == 1
            assert "registry.example/web:1" in offer.artifacts

    asyncio.run(body())


def test_disk_and_gpus_are_fingerprinted_and_accounted(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path / "a") as h:
            fp = h.agent.fingerprint
            free = shutil.disk_usage(tmp_path).free // (1024 * 1024)
            assert abs(fp.disk_mb - free) < 1024  # the data dir's free space, give or take
            assert fp.gpus == 0
        async with running_agent(nats_url, tmp_path / "b", disk_mb=1000, gpus=2) as h:
            offer = await ask_offer(h)
            assert offer.worker.capacity.disk_mb == 1000
            assert offer.worker.capacity.gpus == 2
            await h.claim(SLEEPER, skip_launch=True, guest={"cpus": 1, "disk_mb": 600, "gpus": 1})
            offer = await ask_offer(h, disk=600)
            assert not offer.eligible
            assert offer.reason == "insufficient_disk"
            assert offer.worker.allocated.disk_mb == 600

    asyncio.run(body())


def test_the_agents_metrics_count_offers_claims_and_refusals(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path, metrics_port=free_port()) as h:
            assert h.agent.metrics is not None
            url = f"http://127.0.0.1:{h.agent.metrics.port}/metrics"
            ask = OfferRequest(
                request_id="r1", app=APP, region="mad", resources=Resources(cpus=1, memory_mb=1)
            )
            load(
                Offer,
                unwrap(await h.bus.request(subjects.worker(h.worker_id, "offer"), encode(ask), 5)),
            )
            await h.claim(["sleep", "60"], cpus=1)
            with contextlib.suppress(ClaimRefused):
                await h.claim(["sleep", "60"], cpus=100)  # more than the worker has
            async with httpx.AsyncClient() as http:
                text = (await http.get(url)).text
            w = h.worker_id
            assert f'souq_agent_offers_total{{worker="{w}"}} 1.0' in text
            assert f'souq_agent_claims_total{{outcome="accepted",worker="{w}"}} 1.0' in text
            assert f'souq_agent_claims_total{{outcome="insufficient_cpu",worker="{w}"}} 1.0' in text
            assert f'souq_agent_allocated{{resource="cpus",worker="{w}"}} 1.0' in text
            assert f'souq_agent_bus_connected{{worker="{w}"}} 1.0' in text
            assert "souq_agent_heartbeat_age_seconds{" in text

    asyncio.run(body())
