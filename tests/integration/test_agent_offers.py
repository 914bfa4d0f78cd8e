"""What a worker's offer tells placement beyond capacity: its measured load, how much of the
machine's image it would pull, how many machines of the asking app it runs; and its disk and
gpus in the fingerprint."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
from pathlib import Path

import httpx

from souq.bus import subjects
from souq.bus.codec import decode, encode, unwrap
from souq.errors import ClaimRefused
from souq.images import pack_directory
from souq.images.store import ImageStore
from souq.model import (
    ClaimRequest,
    DestroyCommand,
    Heartbeat,
    MachineConfig,
    MachineState,
    Offer,
    OfferRequest,
    Resources,
)
from souq.model.image import ImageRecord
from souq.natsserver import free_port
from souq.placement import WantedImage
from souq.protocol import verbs as v
from tests.integration.agent_harness import APP, Harness, load, running_agent

SLEEPER = ["sleep", "60"]


async def ask_offer(
    h: Harness, app: str = APP, image: ImageRecord | None = None, **want: int
) -> Offer:
    wanted = None if image is None else WantedImage.of(image)
    req = OfferRequest(
        request_id="r-offer",
        app=app,
        region="mad",
        resources=Resources(cpus=want.get("cpus", 1), memory_mb=256, disk_mb=want.get("disk", 0)),
        image=None if wanted is None else wanted.reference,
        image_layers={} if wanted is None else dict(wanted.layers),
    )
    replies = await h.bus.gather(subjects.offers("mad"), encode(req), expect=1, timeout=5)
    assert len(replies) == 1
    return load(Offer, unwrap(replies[0]))


def test_offers_carry_load_and_the_apps_machines(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            offer = await ask_offer(h)
            assert offer.load is not None
            assert 0 <= offer.load.cpu_percent <= 100
            assert 0 < offer.load.memory_percent <= 100
            assert offer.load.memory_used_mb > 0
            assert offer.app_machines == 0
            assert (offer.image_layers, offer.image_bytes) == (None, None)  # no image asked

            a = await h.claim(SLEEPER, skip_launch=True)
            await h.claim(SLEEPER, skip_launch=True)
            await h.claim(SLEEPER, skip_launch=True, app="other")
            offer = await ask_offer(h)
            assert offer.app_machines == 2
            assert (await ask_offer(h, app="other")).app_machines == 1

            # Destroyed machines leave the count.
            await h.call(v.DESTROY, DestroyCommand(app=APP, machine_id=a.id, force=True))
            offer = await ask_offer(h)
            assert offer.app_machines == 1

    asyncio.run(body())


def test_an_offer_says_how_much_of_the_image_the_worker_would_pull(
    nats_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path / "agent") as h:
            root = tmp_path / "app"
            root.mkdir()
            (root / "data.bin").write_bytes(hashlib.sha256(b"souq").digest() * 4096)
            store = await ImageStore.open(h.bus.client)
            record = await store.put(pack_directory(root, cmd=SLEEPER))
            size = sum(layer.size for layer in record.layers)
            assert size > 0

            # Not cached: every layer to pull.
            offer = await ask_offer(h, image=record)
            assert (offer.image_layers, offer.image_bytes) == (0, size)
            plain = await ask_offer(h)
            assert (plain.image_layers, plain.image_bytes) == (None, None)

            # A machine of the image makes the worker pull it; then it is cached.
            config = MachineConfig.model_validate(
                {"image": record.reference, "guest": {"cpus": 1, "memory_mb": 64}}
            )
            claim = ClaimRequest(
                request_id="r-image",
                body_hash="h-image",
                app=APP,
                region="mad",
                config=config,
                image=record,
            )
            machine = await h.call(v.CLAIM, claim)
            assert machine.placement is not None and machine.placement.cached is False
            await h.wait(machine.id, MachineState.STARTED, timeout_s=30)
            offer = await ask_offer(h, image=record)
            assert (offer.image_layers, offer.image_bytes) == (len(record.layers), 0)
            assert record.reference in offer.worker.images

            # Its heartbeats say so too: brokers' books learn the image and its layers.
            beats: asyncio.Queue[Heartbeat] = asyncio.Queue()

            async def on_beat(subject: str, data: bytes) -> None:
                beats.put_nowait(decode(data, Heartbeat))

            await h.bus.subscribe(subjects.heartbeat("mad", h.worker_id), on_beat)
            async with asyncio.timeout(5):
                beat = await beats.get()
            assert record.reference in beat.worker.images
            assert {d for d, _ in WantedImage.of(record).layers} <= set(beat.layers)

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
