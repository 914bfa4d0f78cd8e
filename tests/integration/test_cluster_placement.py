"""Placement through a real cluster: label constraints steer machines and, when nobody can meet
them, the refusal names the constraint; `distinct_workers_for: app` keeps an app's machines on
different workers; the create body chooses the policy."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from souq.errors import InsufficientCapacity
from souq.testing import Cluster, auth_headers
from tests.clusters import ClusterSpec, agent

REGION = "lab"


# Region `lab`: a worker labelled disk=ssd and one labelled disk=hdd (4 cpus each).
CLUSTER = ClusterSpec(
    "labelled",
    regions={REGION: 0},
    agents=(agent(REGION, labels={"disk": "ssd"}), agent(REGION, labels={"disk": "hdd"})),
)


def sleeper(**config: Any) -> dict[str, Any]:
    return {"cmd": ["sleep", "600"], "guest": {"cpus": 0.5, "memory_mb": 64}, **config}


def app_name() -> str:
    return "plc" + uuid.uuid4().hex[:8]


def worker_with(cluster: Cluster, disk: str) -> str:
    [agent] = [a for a in cluster.agents if a.labels.get("disk") == disk]
    assert agent.worker_id is not None
    return agent.worker_id


def test_a_label_constraint_steers_placement(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    ssd_only = sleeper(constraints=[{"attribute": "label.disk", "operator": "=", "value": "ssd"}])
    made = [client.create_machine(app, REGION, ssd_only, skip_launch=True) for _ in range(3)]
    assert {m.worker_id for m in made} == {worker_with(cluster, "ssd")}
    record = made[0].placement
    assert record is not None
    assert record.rejections == {"constraint": 1}
    assert record.unmet == {"constraint": ["label.disk = ssd"]}
    # Every machine of the app is on the ssd worker even though anti-affinity would spread them.
    not_ssd = sleeper(
        constraints=[{"attribute": "label.disk", "operator": "not_in", "value": ["ssd"]}]
    )
    other = client.create_machine(app, REGION, not_ssd, skip_launch=True)
    assert other.worker_id == worker_with(cluster, "hdd")
    for m in [*made, other]:
        client.destroy(app, m.id, force=True)


def test_an_unsatisfiable_constraint_is_refused_naming_it(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    nvme = sleeper(constraints=[{"attribute": "label.disk", "value": "nvme"}])
    with pytest.raises(InsufficientCapacity) as caught:
        client.create_machine(app, REGION, nvme)
    err = caught.value
    assert err.http_status == 409
    assert err.status == "insufficient_capacity"
    assert "2 constraint (label.disk = nvme)" in err.message
    assert err.details["placement"]["unmet"] == {"constraint": ["label.disk = nvme"]}
    assert client.list_machines(app) == []


def test_distinct_workers_for_app_spreads_then_refuses_a_third(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    distinct = sleeper(distinct_workers_for="app")
    first = client.create_machine(app, REGION, distinct, skip_launch=True)
    second = client.create_machine(app, REGION, distinct, skip_launch=True)
    assert {first.worker_id, second.worker_id} == {a.worker_id for a in cluster.agents}
    with pytest.raises(InsufficientCapacity) as caught:
        client.create_machine(app, REGION, distinct, skip_launch=True)
    assert "2 distinct_workers" in caught.value.message
    # Destroying one makes room on its worker again.
    client.destroy(app, first.id, force=True)
    third = client.create_machine(app, REGION, distinct, skip_launch=True)
    assert third.worker_id == first.worker_id
    for m in (second, third):
        client.destroy(app, m.id, force=True)


def test_the_create_body_chooses_the_policy(cluster: Cluster) -> None:
    app = app_name()
    url = f"{cluster.api_url}/v1/apps/{app}/machines"
    body = {
        "region": REGION,
        "skip_launch": True,
        "config": sleeper(),
        "placement": {"policy": "binpack", "weights": {"load": 0}},
    }
    response = httpx.post(url, json=body, timeout=30, headers=auth_headers())
    assert response.status_code == 201, response.text
    placement = response.json()["placement"]
    assert placement["policy"] == "binpack"
    assert placement["weights"] == {"binpack": 1.0, "anti-affinity": 0.5, "cache": 1.0}
    httpx.delete(
        f"{url}/{response.json()['id']}",
        params={"force": "true"},
        timeout=30,
        headers=auth_headers(),
    )

    bad = {**body, "placement": {"weights": {"fastest": 1}}}
    response = httpx.post(url, json=bad, timeout=30, headers=auth_headers())
    assert response.status_code == 422
    assert response.json()["status"] == "invalid_input"
    assert "unknown scorer 'fastest'" in response.json()["error"]
