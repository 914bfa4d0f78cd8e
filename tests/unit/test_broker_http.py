"""The HTTP API over fake workers: status codes, error bodies naming the field, and the routes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from souq.broker.app import create_app
from souq.bus import MemoryTransport
from souq.model import MachineState

from .broker_fakes import FakeWorker, started_service

pytestmark = pytest.mark.anyio

GOOD: dict[str, Any] = {"region": "mad", "config": {"cmd": ["sleep", "1"]}}


def with_config(**config: Any) -> dict[str, Any]:
    return {"region": "mad", "config": {"cmd": ["sleep", "1"], **config}}


class Api:
    def __init__(self, http: httpx.AsyncClient, bus: MemoryTransport, workers: list[FakeWorker]):
        self.http = http
        self.bus = bus
        self.workers = workers

    async def create(self, body: Any = None, app: str = "web", **kw: Any) -> httpx.Response:
        return await self.http.post(f"/v1/apps/{app}/machines", json=body or GOOD, **kw)


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    bus = MemoryTransport()
    workers = [FakeWorker(bus, "wa", cpus=2), FakeWorker(bus, "wb", cpus=2)]
    service = await started_service(bus, *workers)
    transport = httpx.ASGITransport(app=create_app(service), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://souq") as http:
        yield Api(http, bus, workers)
    await service.close()


def error_of(r: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = r.json()
    assert set(body) >= {"error", "status"}, body
    return body


async def test_create_answers_201_with_the_machine(api: Api) -> None:
    r = await api.create(
        {"name": "web-1", "region": "mad", "config": {"cmd": ["sleep", "1"], "env": {"A": "1"}}}
    )
    assert r.status_code == 201, r.text
    m = r.json()
    assert {"id", "name", "app", "region", "worker_id", "state", "config", "created_at"} <= set(m)
    assert {"updated_at", "events", "placement"} <= set(m)
    assert (m["name"], m["app"], m["region"], m["state"]) == ("web-1", "web", "mad", "started")
    assert m["config"]["restart"]["policy"] == "on-failure"
    assert m["placement"]["winner"] == m["worker_id"]
    assert m["events"][0] == {
        "type": "launch",
        "status": "started",
        "source": "user",
        "timestamp": m["events"][0]["timestamp"],
        "exit_code": None,
        "signal": None,
        "message": None,
        "oom_killed": False,
        "request": None,  # Fly's form of an exit, on exit events only
    }


async def test_malformed_json_is_400(api: Api) -> None:
    r = await api.http.post(
        "/v1/apps/web/machines",
        content=b'{"region": "mad", "config": {',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    assert error_of(r)["status"] == "malformed_request"
    empty = await api.http.post("/v1/apps/web/machines", content=b"")
    assert (empty.status_code, error_of(empty)["status"]) == (400, "malformed_request")


async def test_a_json_body_without_content_type_is_still_read(api: Api) -> None:
    r = await api.http.post(
        "/v1/apps/web/machines", content=b'{"region":"mad","config":{"cmd":["x"]}}'
    )
    assert r.status_code == 201, r.text


BAD = [
    ("unknown top-level field", {**GOOD, "regoin": "mad"}, "regoin: unknown field"),
    ("typo in config", with_config(gust={"cpus": 1}), "config.gust: unknown field"),
    ("empty cmd", {"region": "mad", "config": {"cmd": []}}, "config: cmd: give the command to run"),
    ("cmd not a list", {"region": "mad", "config": {"cmd": "sleep 1"}}, "config.cmd: Input"),
    ("cmd of numbers", {"region": "mad", "config": {"cmd": [1]}}, "config.cmd[0]: Input"),
    ("blank command", {"region": "mad", "config": {"cmd": [" "]}}, "config.cmd: the command"),
    (
        "zero cpus",
        with_config(guest={"cpus": 0}),
        "config.guest.cpus: Input should be greater than or equal to 0.001",
    ),
    (
        "negative cpus",
        with_config(guest={"cpus": -1}),
        "config.guest.cpus: Input should be greater",
    ),
    ("cpus as text", with_config(guest={"cpus": "2"}), "config.guest.cpus: Input should be"),
    ("negative memory", with_config(guest={"memory_mb": -5}), "config.guest.memory_mb"),
    (
        "unknown restart policy",
        with_config(restart={"policy": "sometimes"}),
        "config.restart.policy: Input should be 'no', 'on-failure' or 'always'",
    ),
    (
        "unknown signal",
        with_config(stop_config={"signal": "SIGNOPE"}),
        "config.stop_config.signal: unknown signal 'SIGNOPE'",
    ),
    ("reserved env", with_config(env={"SOUQ_APP": "x"}), "config.env: 'SOUQ_APP'"),
    ("skip_secrets", {**GOOD, "skip_secrets": "sometimes"}, "skip_secrets"),
    (
        "Fly's auto-extend",
        with_config(mounts=[{"volume": "vol_w1_ab", "path": "/d", "add_size_gb": 2}]),
        "config.mounts[0]: add_size_gb: not supported by Souq",
    ),
    (
        "two mounts",
        with_config(mounts=[{"volume": "vol_w1_ab", "path": "/d"}, {"name": "x", "path": "/e"}]),
        "config.mounts: a machine mounts at most one volume",
    ),
    (
        "a relative mount",
        with_config(mounts=[{"name": "x", "path": "d"}]),
        "config.mounts[0].path: must be an absolute path",
    ),
    (
        "Fly's tls",
        with_config(services=[{"internal_port": 80, "ports": [{"handlers": ["tls"]}]}]),
        "config.services[0].ports[0].handlers: handler 'tls' is not supported",
    ),
    ("region with a dot", {**GOOD, "region": "mad.x"}, "region: String should match"),
    ("bad name", {**GOOD, "name": "-x"}, "name: name must be"),
    ("skip_launch as text", {**GOOD, "skip_launch": "yes"}, "skip_launch: Input should be"),
    ("not an object", ["region"], "body: Input should be"),
]


@pytest.mark.parametrize(("label", "body", "message"), BAD, ids=[c[0] for c in BAD])
async def test_invalid_input_is_422_naming_the_field(
    api: Api, label: str, body: Any, message: str
) -> None:
    r = await api.create(body)
    assert r.status_code == 422, r.text
    err = error_of(r)
    assert err["status"] == "invalid_input"
    assert err["error"].startswith(message), err["error"]
    assert err["fields"][0]["field"] in err["error"]
    assert all(not w.claims for w in api.workers)


async def test_unknown_region_is_422_unknown_region(api: Api) -> None:
    r = await api.create({**GOOD, "region": "atlantis"})
    assert r.status_code == 422
    err = error_of(r)
    assert err["status"] == "unknown_region"
    assert "atlantis" in err["error"] and "mad" in err["error"]


async def test_bad_app_name_is_422(api: Api) -> None:
    r = await api.create(app="Bad_App!")
    assert r.status_code == 422
    assert error_of(r)["status"] == "invalid_input"
    assert "Bad_App!" in error_of(r)["error"]


async def test_insufficient_capacity_is_409_with_the_record(api: Api) -> None:
    r = await api.create(with_config(guest={"cpus": 3}))
    assert r.status_code == 409
    err = error_of(r)
    assert err["status"] == "insufficient_capacity"
    assert err["error"] == "no worker in region mad can take 3 cpus / 256 MiB: 2 full"
    assert err["hint"]
    assert err["placement"]["rejections"] == {"full": 2}


async def test_idempotency_key_header(api: Api) -> None:
    headers = {"Idempotency-Key": "abc"}
    r1 = await api.create(headers=headers)
    r2 = await api.create(headers=headers)
    assert (r1.status_code, r2.status_code) == (201, 201)
    assert r1.json()["id"] == r2.json()["id"]
    r3 = await api.create(with_config(guest={"cpus": 2}), headers=headers)
    assert (r3.status_code, error_of(r3)["status"]) == (409, "idempotency_conflict")


async def test_unknown_routes_and_machines_are_404_not_found(api: Api) -> None:
    r = await api.http.get("/v1/nothing")
    assert (r.status_code, error_of(r)["status"]) == (404, "not_found")
    r = await api.http.get("/v1/apps/web/machines/0123456789abcd")
    assert (r.status_code, error_of(r)["status"]) == (404, "not_found")
    assert "0123456789abcd" in error_of(r)["error"]
    r = await api.http.put("/v1/apps/web/machines")
    assert (r.status_code, error_of(r)["status"]) == (405, "method_not_allowed")


async def test_the_bus_down_is_503_unavailable(api: Api) -> None:
    api.bus.connected_flag = False
    r = await api.create()
    assert (r.status_code, error_of(r)["status"]) == (503, "unavailable")
    r = await api.http.get("/healthz")
    assert (r.status_code, error_of(r)["status"]) == (503, "unavailable")
    r = await api.http.get("/v1/workers")
    assert (r.status_code, error_of(r)["status"]) == (503, "unavailable")
    r = await api.http.get("/v1/apps/web/machines")
    assert (r.status_code, error_of(r)["status"]) == (503, "unavailable")


async def test_healthz_and_workers(api: Api) -> None:
    r = await api.http.get("/healthz")
    assert r.status_code == 200
    # nats_server: HOST:PORT of the NATS node; none on the in-memory bus
    assert r.json() == {"status": "ok", "nats": "connected", "nats_server": "", "workers": 2}
    r = await api.http.get("/v1/workers")
    assert [w["id"] for w in r.json()] == ["wa", "wb"]
    w = r.json()[0]
    assert w["state"] == "up"
    assert w["capacity"] == {"cpus": 2.0, "memory_mb": 4096, "disk_mb": 0, "gpus": 0}
    assert w["allocated"] == {"cpus": 0.0, "memory_mb": 0, "disk_mb": 0, "gpus": 0}
    assert w["labels"] == {}


async def test_machine_routes(api: Api) -> None:
    m = (await api.create()).json()
    base = f"/v1/apps/web/machines/{m['id']}"
    assert [x["id"] for x in (await api.http.get("/v1/apps/web/machines")).json()] == [m["id"]]
    assert (await api.http.get(base)).json()["id"] == m["id"]
    stop = await api.http.post(base + "/stop", json={"signal": "term", "timeout_s": 2})
    assert stop.status_code == 200, stop.text
    assert stop.json()["state"] == "stopped"
    no_body = await api.http.post(base + "/stop")
    assert no_body.status_code == 200
    bad_signal = await api.http.post(base + "/signal", json={"signal": "NOPE"})
    assert (bad_signal.status_code, error_of(bad_signal)["status"]) == (422, "invalid_input")
    assert error_of(bad_signal)["error"].startswith("signal: unknown signal")
    wait = await api.http.get(base + "/wait", params={"state": "stopped", "timeout": 1})
    assert (wait.status_code, wait.json()["state"]) == (200, "stopped")
    started = await api.http.post(base + "/start")
    assert started.json()["state"] == "started"
    timeout = await api.http.get(base + "/wait", params={"state": "stopped", "timeout": 0.01})
    assert (timeout.status_code, error_of(timeout)["status"]) == (408, "timeout")
    bad_state = await api.http.get(base + "/wait", params={"state": "asleep"})
    assert (bad_state.status_code, error_of(bad_state)["status"]) == (422, "invalid_input")
    assert error_of(bad_state)["error"].startswith("state[0]: ")  # one of several
    events = await api.http.get(base + "/events")
    assert events.json()[0]["type"] == "launch"
    refused = await api.http.delete(base)
    assert (refused.status_code, error_of(refused)["status"]) == (409, "illegal_transition")
    gone = await api.http.delete(base, params={"force": "true"})
    assert gone.json()["state"] == "destroyed"


async def test_logs_plain_and_followed(api: Api) -> None:
    m = (await api.create()).json()
    owner = next(w for w in api.workers if w.id == m["worker_id"])
    owner.write("hello\n")
    base = f"/v1/apps/web/machines/{m['id']}/logs"
    r = await api.http.get(base)
    assert (r.status_code, r.text) == (200, "hello\n")
    assert r.headers["content-type"].startswith("text/plain")
    # httpx's ASGI transport gathers the whole body: the stream is read once it has ended.
    follow = asyncio.ensure_future(api.http.get(base, params={"follow": "true"}))
    await asyncio.wait_for(owner.polling.wait(), 5)  # "hello" was read; the next read waits
    owner.polling.clear()
    owner.write("again\n")
    await asyncio.wait_for(owner.polling.wait(), 5)
    await owner.set_state(m["id"], MachineState.DESTROYED)
    r = await asyncio.wait_for(follow, 5)
    assert (r.status_code, r.text) == (200, "hello\nagain\n")
    missing = await api.http.get("/v1/apps/web/machines/nope/logs", params={"follow": "true"})
    assert missing.status_code == 404


async def test_openapi_documents_the_routes_and_bodies(api: Api) -> None:
    r = await api.http.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    paths = doc["paths"]
    for path in (
        "/healthz",
        "/v1/workers",
        "/v1/apps/{app}/machines",
        "/v1/apps/{app}/machines/{machine_id}",
        "/v1/apps/{app}/machines/{machine_id}/wait",
        "/v1/apps/{app}/machines/{machine_id}/logs",
    ):
        assert path in paths
    schemas = doc["components"]["schemas"]
    assert {"CreateMachineRequest", "MachineConfig", "Machine", "ErrorBody"} <= set(schemas)
    create = paths["/v1/apps/{app}/machines"]["post"]
    body = create["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/CreateMachineRequest"}
    assert "201" in create["responses"] and "409" in create["responses"]
    ref = schemas["CreateMachineRequest"]["properties"]["config"]["$ref"]
    assert ref == "#/components/schemas/MachineConfig"
