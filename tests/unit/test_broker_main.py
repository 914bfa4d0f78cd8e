"""``serve``: the embeddable broker, on a real nats-server and a real socket, with a fake worker
speaking the protocol over NATS."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from souq.broker.config import BrokerConfig
from souq.broker.main import serve
from souq.bus.nats import connect
from souq.errors import Unavailable
from souq.natsserver import NatsServer, free_port

from .broker_fakes import FakeWorker

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    try:
        server = NatsServer(store_dir=tmp_path_factory.mktemp("nats"))
        server.start()
    except Unavailable as exc:  # pragma: no cover - nats-server ships with Souq
        pytest.skip(str(exc))
    yield server
    server.stop()


async def test_serve_places_over_nats_and_stops_in_order(nats: NatsServer, tmp_path: Path) -> None:
    worker_bus = await connect(nats.url, name="fake-worker")
    await FakeWorker(worker_bus, "wnats").start()  # type: ignore[arg-type]
    port = free_port()
    ready, stop = asyncio.Event(), asyncio.Event()
    config = BrokerConfig(nats_url=nats.url, listen_port=port)
    task = asyncio.create_task(serve(config, ready=ready, stop=stop))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            health = await http.get("/healthz")
            assert health.status_code == 200
            workers = (await http.get("/v1/workers")).json()
            assert [w["id"] for w in workers] == ["wnats"]
            body = {"region": "mad", "config": {"cmd": ["sleep", "1"]}}
            created = await http.post("/v1/apps/web/machines", json=body)
            assert created.status_code == 201, created.text
            placement = created.json()["placement"]
            assert (placement["expected_offers"], placement["offers_received"]) == (1, 1)
            got = await http.get(f"/v1/apps/web/machines/{created.json()['id']}")
            assert got.json()["worker_id"] == "wnats"
            unknown = await http.post("/v1/apps/web/machines", json={**body, "region": "syd"})
            assert unknown.json()["status"] == "unknown_region"
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await worker_bus.close()
    # The port is released.
    with socket.create_server(("127.0.0.1", port)):
        pass


async def test_serve_reports_a_port_in_use(nats: NatsServer) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        config = BrokerConfig(nats_url=nats.url, listen_port=port)
        with pytest.raises(Unavailable, match=f"cannot listen on 127.0.0.1:{port}"):
            await asyncio.wait_for(serve(config), 10)


async def test_serve_without_nats_is_unavailable() -> None:
    config = BrokerConfig(
        nats_url=f"nats://127.0.0.1:{free_port()}",
        listen_port=free_port(),
        nats_connect_timeout_s=0.5,
    )
    with pytest.raises(Unavailable, match="cannot connect to NATS"):
        await asyncio.wait_for(serve(config), 20)
