"""Bad input gets a clear, typed error and changes nothing."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from souq.testing import Cluster, auth_headers


def post(cluster: Cluster, app: str, body: Any, raw: bytes | None = None) -> httpx.Response:
    url = f"{cluster.api_url}/v1/apps/{app}/machines"
    if raw is not None:
        return httpx.post(
            url, content=raw, headers={"content-type": "application/json", **auth_headers()}
        )
    return httpx.post(url, json=body, timeout=30, headers=auth_headers())


GOOD = {"region": "mad", "config": {"cmd": ["sleep", "1"]}}


def with_config(**config: Any) -> dict[str, Any]:
    return {"region": "mad", "config": {"cmd": ["sleep", "1"], **config}}


CASES = [
    ("unknown top-level field", {**GOOD, "regoin": "mad"}, 422, "invalid_input", "regoin"),
    ("typo in config", with_config(gust={"cpus": 1}), 422, "invalid_input", "gust"),
    ("empty cmd", {"region": "mad", "config": {"cmd": []}}, 422, "invalid_input", "cmd"),
    (
        "cmd not a list",
        {"region": "mad", "config": {"cmd": "sleep 1"}},
        422,
        "invalid_input",
        "cmd",
    ),
    ("zero cpus", with_config(guest={"cpus": 0}), 422, "invalid_input", "cpus"),
    ("negative memory", with_config(guest={"memory_mb": -5}), 422, "invalid_input", "memory_mb"),
    (
        "unknown restart policy",
        with_config(restart={"policy": "sometimes"}),
        422,
        "invalid_input",
        "policy",
    ),
    (
        "unknown signal",
        with_config(stop_config={"signal": "SIGNOPE"}),
        422,
        "invalid_input",
        "signal",
    ),
    (
        "Fly's mounts",
        with_config(mounts=[{"volume": "nope", "path": "data"}]),
        422,
        "invalid_input",
        "path",
    ),
    ("unknown region", {**GOOD, "region": "atlantis"}, 422, "unknown_region", "atlantis"),
]


@pytest.mark.parametrize(
    ("label", "body", "code", "status", "names"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_input_is_refused_and_nothing_is_created(
    cluster: Cluster, label: str, body: Any, code: int, status: str, names: str
) -> None:
    app = "bad" + uuid.uuid4().hex[:8]
    r = post(cluster, app, body)
    assert r.status_code == code, r.text
    payload = r.json()
    assert payload["status"] == status
    assert names in payload["error"]
    assert cluster.client().list_machines(app) == []


def test_malformed_json_is_400(cluster: Cluster) -> None:
    app = "bad" + uuid.uuid4().hex[:8]
    r = post(cluster, app, None, raw=b'{"region": "mad", "config": {')
    assert r.status_code == 400
    assert r.json()["status"] == "malformed_request"
    assert cluster.client().list_machines(app) == []


def test_bad_app_name_is_refused(cluster: Cluster) -> None:
    r = post(cluster, "Bad_App!", GOOD)
    assert r.status_code == 422
    assert r.json()["status"] == "invalid_input"


def test_unknown_route_and_machine_give_not_found(cluster: Cluster) -> None:
    r = httpx.get(f"{cluster.api_url}/v1/apps/nope/machines/0123456789abcd", headers=auth_headers())
    assert r.status_code == 404
    assert r.json()["status"] == "not_found"
    assert "0123456789abcd" in r.json()["error"]
