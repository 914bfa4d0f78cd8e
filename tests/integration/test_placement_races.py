"""Correct under races: three brokers place concurrently onto one region, and the worker's claim
is the only serialisation point. Real nats-server, real ``souq agent`` and ``souq broker``
processes."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import httpx

from souq.testing import Cluster, auth_headers
from tests.clusters import ClusterSpec

WORKERS = 4
CPUS = 2  # per worker: 8 one-cpu machines fit in the region, exactly
FITS = WORKERS * CPUS
CREATES = 200


CLUSTER = ClusterSpec("races", regions={"race": WORKERS}, cpus=CPUS, memory_mb=4096, brokers=3)


def body() -> dict[str, object]:
    return {
        "region": "race",
        "skip_launch": True,
        "config": {"cmd": ["sleep", "600"], "guest": {"cpus": 1, "memory_mb": 64}},
    }


async def _storm(
    urls: list[str], app: str, n: int, headers: dict[str, str] | None = None
) -> list[httpx.Response]:
    """``n`` creates at once, spread round-robin over the brokers."""
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        return await asyncio.gather(
            *(
                client.post(
                    f"{urls[i % len(urls)]}/v1/apps/{app}/machines",
                    json=body(),
                    headers={**auth_headers(), **(headers or {})},
                )
                for i in range(n)
            )
        )


def _destroy_all(cluster: Cluster, app: str) -> None:
    client = cluster.client()
    for machine in client.list_machines(app):
        client.destroy(app, machine.id, force=True)


def test_concurrent_creates_on_three_brokers_fill_exactly_the_capacity(
    cluster: Cluster,
) -> None:
    app = "race" + uuid.uuid4().hex[:8]
    urls = [b.url for b in cluster.brokers]
    answers = asyncio.run(_storm(urls, app, CREATES))

    codes = Counter(r.status_code for r in answers)
    assert codes == {201: FITS, 409: CREATES - FITS}, codes
    refusals = {r.json()["status"] for r in answers if r.status_code == 409}
    assert refusals == {"insufficient_capacity"}
    placed = [r.json() for r in answers if r.status_code == 201]
    assert len({m["id"] for m in placed}) == FITS

    # No worker is over its capacity, as the brokers see it and as the agents themselves do.
    for i in range(len(cluster.brokers)):
        for worker in cluster.client(i).workers():
            assert worker.allocated.cpus <= worker.capacity.cpus
    per_worker = Counter(m["worker_id"] for m in placed)
    assert all(n <= CPUS for n in per_worker.values()), per_worker
    listed = cluster.client().list_machines(app)
    assert sorted(m.id for m in listed) == sorted(m["id"] for m in placed)
    _destroy_all(cluster, app)


def test_the_same_idempotency_key_on_every_broker_makes_one_machine(
    cluster: Cluster,
) -> None:
    urls = [b.url for b in cluster.brokers]
    for _ in range(3):  # a few rounds: each a fresh key, sent 4 times to each broker at once
        app = "idem" + uuid.uuid4().hex[:8]
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        answers = asyncio.run(_storm(urls, app, 4 * len(urls), headers))
        assert {r.status_code for r in answers} <= {200, 201}, [r.text for r in answers]
        assert len({r.json()["id"] for r in answers}) == 1
        assert len(cluster.client().list_machines(app)) == 1
        _destroy_all(cluster, app)
