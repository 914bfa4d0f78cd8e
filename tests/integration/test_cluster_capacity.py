"""Capacity is accounted to the exact limit, refused beyond it with nothing created, and released
by destroy; creates are idempotent."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from souq.errors import IdempotencyConflict, InsufficientCapacity
from souq.testing import Cluster, auth_headers
from tests.clusters import ClusterSpec

# Region `cap`: two workers of 2 cpus and 1024 MiB each (4 cpus, 2048 MiB in all).
CLUSTER = ClusterSpec("small", regions={"cap": 2}, cpus=2, memory_mb=1024)


def one_cpu(mem: int = 256) -> dict[str, object]:
    return {"cmd": ["sleep", "600"], "guest": {"cpus": 1, "memory_mb": mem}}


def test_capacity_to_the_exact_limit_then_refused_then_released(cluster: Cluster) -> None:
    client = cluster.client()
    app = "cap" + uuid.uuid4().hex[:8]
    made = [client.create_machine(app, "cap", one_cpu()) for _ in range(4)]
    # Four one-cpu machines fill both workers exactly: two each.
    per_worker = {w.id: w.allocated.cpus for w in client.workers()}
    assert sorted(per_worker.values()) == [2.0, 2.0]

    with pytest.raises(InsufficientCapacity) as err:
        client.create_machine(app, "cap", one_cpu())
    assert err.value.http_status == 409
    assert "insufficient_cpu" in err.value.message
    placement = err.value.details["placement"]
    assert placement["rejections"] == {"insufficient_cpu": 2}
    assert len(client.list_machines(app)) == 4  # nothing was created

    # A stopped machine keeps its reservation ...
    client.stop(app, made[0].id)
    client.wait(app, made[0].id, "stopped", timeout=10)
    with pytest.raises(InsufficientCapacity):
        client.create_machine(app, "cap", one_cpu())
    # ... and destroy releases it.
    client.destroy(app, made[0].id)
    replacement = client.create_machine(app, "cap", one_cpu())
    assert replacement.worker_id == made[0].worker_id
    for m in [*made[1:], replacement]:
        client.destroy(app, m.id, force=True)
    assert all(w.allocated.cpus == 0 for w in client.workers())


def test_memory_is_accounted_too(cluster: Cluster) -> None:
    client = cluster.client()
    app = "mem" + uuid.uuid4().hex[:8]
    big = {"cmd": ["sleep", "600"], "guest": {"cpus": 0.5, "memory_mb": 1024}}
    a = client.create_machine(app, "cap", big)
    b = client.create_machine(app, "cap", big)
    assert a.worker_id != b.worker_id
    with pytest.raises(InsufficientCapacity) as err:
        client.create_machine(app, "cap", {**big, "guest": {"cpus": 0.5, "memory_mb": 1}})
    assert err.value.details["placement"]["rejections"] == {"insufficient_memory": 2}
    for m in (a, b):
        client.destroy(app, m.id, force=True)


def test_too_big_for_any_worker_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    client = cluster.client()
    app = "big" + uuid.uuid4().hex[:8]
    with pytest.raises(InsufficientCapacity):
        client.create_machine(app, "cap", {"cmd": ["sleep", "1"], "guest": {"cpus": 3}})
    assert client.list_machines(app) == []


def test_idempotent_create_makes_one_machine(cluster: Cluster) -> None:
    client = cluster.client()
    app = "idem" + uuid.uuid4().hex[:8]
    key = uuid.uuid4().hex
    first = client.create_machine(app, "cap", one_cpu(), idempotency_key=key)
    again = client.create_machine(app, "cap", one_cpu(), idempotency_key=key)
    assert again.id == first.id
    assert [m.id for m in client.list_machines(app)] == [first.id]
    with pytest.raises(IdempotencyConflict) as err:
        client.create_machine(app, "cap", one_cpu(mem=300), idempotency_key=key)
    assert err.value.http_status == 409
    assert len(client.list_machines(app)) == 1
    client.destroy(app, first.id, force=True)


def test_idempotency_key_over_raw_http(cluster: Cluster) -> None:
    app = "raw" + uuid.uuid4().hex[:8]
    body = {"region": "cap", "config": one_cpu()}
    headers = {"Idempotency-Key": uuid.uuid4().hex, **auth_headers()}
    url = f"{cluster.api_url}/v1/apps/{app}/machines"
    r1 = httpx.post(url, json=body, headers=headers, timeout=30)
    r2 = httpx.post(url, json=body, headers=headers, timeout=30)
    assert r1.status_code == 201
    assert r2.status_code in (200, 201)
    assert r1.json()["id"] == r2.json()["id"]
    cluster.client().destroy(app, r1.json()["id"], force=True)
