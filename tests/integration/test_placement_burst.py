"""A burst of concurrent creates at a cluster with room for all of them places every one, and one
past its room refuses only the excess, each refusal naming why. Real nats-server, real ``souq
agent`` and ``souq broker`` processes; the machines are real processes.

Under a burst the workers are busy: hundreds of claims queue at each (every one a transaction and
a spawn), and a claim may go unanswered past the broker's ``claim_timeout_s``. The broker then
sends it again to the same worker while the worker is heard (idempotent per request id), rather
than give it up: giving it up refused creates while room was left (``insufficient_capacity``
with "unavailable" claims) and left the late-made machine beside its replacement elsewhere."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import httpx

from souq.testing import Cluster, auth_headers
from tests.clusters import ClusterSpec

WORKERS = 3
CPUS = 1.2  # per worker
SIZE = 0.01  # cpus per machine: 120 fit on a worker, 360 in the region
BURST = 300  # room for all of them, and 0.6 cpus to spare


CLUSTER = ClusterSpec("burst", regions={"burst": WORKERS}, cpus=CPUS, memory_mb=65536)


def body(*, launch: bool) -> dict[str, object]:
    return {
        "region": "burst",
        "skip_launch": not launch,
        "config": {"cmd": ["sleep", "600"], "guest": {"cpus": SIZE, "memory_mb": 1}},
    }


async def _burst(url: str, app: str, n: int, *, launch: bool) -> list[httpx.Response]:
    """``n`` creates at once, each on a connection of its own."""
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(
            *(
                client.post(
                    f"{url}/v1/apps/{app}/machines",
                    json=body(launch=launch),
                    headers=auth_headers(),
                )
                for _ in range(n)
            )
        )


def _no_worker_over(cluster: Cluster, placed: list[dict[str, object]]) -> None:
    for worker in cluster.client().workers():
        assert worker.allocated.cpus <= worker.capacity.cpus + 1e-9, worker
    per_worker = Counter(m["worker_id"] for m in placed)
    assert all(n <= round(CPUS / SIZE) for n in per_worker.values()), per_worker


def _destroy_all(cluster: Cluster, app: str) -> None:
    """Destroy the app's machines, many at once (one by one, hundreds take minutes)."""

    async def destroy(ids: list[str]) -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            return await asyncio.gather(
                *(
                    client.delete(
                        f"{cluster.api_url}/v1/apps/{app}/machines/{machine_id}",
                        params={"force": "true"},
                        headers=auth_headers(),
                    )
                    for machine_id in ids
                )
            )

    client = cluster.client()
    answers = asyncio.run(destroy([m.id for m in client.list_machines(app)]))
    assert all(r.status_code in (200, 503) for r in answers), [r.text for r in answers]
    for machine in client.list_machines(app):  # one a busy worker did not answer in time
        if machine.state != "destroyed":
            client.destroy(app, machine.id, force=True)
    assert all(w.allocated.cpus == 0 for w in cluster.client().workers())


def test_a_burst_with_room_for_all_places_every_create(cluster: Cluster) -> None:
    app = "burst" + uuid.uuid4().hex[:8]
    answers = asyncio.run(_burst(cluster.api_url, app, BURST, launch=True))

    codes = Counter(r.status_code for r in answers)
    refused = [r.json() for r in answers if r.status_code != 201]
    assert codes == {201: BURST}, (codes, refused[:2])
    placed = [r.json() for r in answers]
    assert len({m["id"] for m in placed}) == BURST
    assert all(m["state"] == "started" for m in placed), Counter(m["state"] for m in placed)
    _no_worker_over(cluster, placed)
    # Every machine that exists was answered to its create: none made unseen by a claim given
    # up on a busy worker (and placed again elsewhere).
    listed = cluster.client().list_machines(app)
    assert sorted(m.id for m in listed) == sorted(m["id"] for m in placed)
    allocated = sum(w.allocated.millicpus for w in cluster.client().workers())
    assert allocated == BURST * round(SIZE * 1000)
    _destroy_all(cluster, app)


def test_a_burst_past_the_room_refuses_only_the_excess(cluster: Cluster) -> None:
    app = "full" + uuid.uuid4().hex[:8]
    fits = WORKERS * round(CPUS / SIZE)
    excess = 40
    answers = asyncio.run(_burst(cluster.api_url, app, fits + excess, launch=False))

    codes = Counter(r.status_code for r in answers)
    assert codes == {201: fits, 409: excess}, codes
    placed = [r.json() for r in answers if r.status_code == 201]
    _no_worker_over(cluster, placed)
    assert all(w.allocated.cpus == w.capacity.cpus for w in cluster.client().workers())
    for refusal in (r.json() for r in answers if r.status_code == 409):
        assert refusal["status"] == "insufficient_capacity"
        assert "insufficient_cpu" in refusal["error"], refusal["error"]
        record = refusal["placement"]
        # Every worker said why it could not (in its offer, or by refusing the claim).
        said = set(record["rejections"]) | {c["reason"] for c in record["claims"]}
        assert said == {"insufficient_cpu"}, record
    listed = cluster.client().list_machines(app)
    assert sorted(m.id for m in listed) == sorted(m["id"] for m in placed)
    _destroy_all(cluster, app)
