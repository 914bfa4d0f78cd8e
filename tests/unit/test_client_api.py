"""The Python client against a mock transport: requests it sends, typed errors it raises."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from souq.client import SouqClient
from souq.errors import (
    IllegalTransition,
    InsufficientCapacity,
    NotFound,
    SouqError,
    Unavailable,
    WaitTimeout,
)
from souq.model import MachineConfig

MACHINE: dict[str, Any] = {
    "id": "0123456789abcd",
    "name": "web-1",
    "app": "web",
    "region": "mad",
    "worker_id": "w1",
    "state": "started",
    "config": {"cmd": ["sleep", "1"], "restart": {"policy": "always", "max_retries": 1}},
    "created_at": "2026-01-01T00:00:00.000Z",
    "updated_at": "2026-01-01T00:00:00.000Z",
    "events": [],
    "placement": None,
}


def client_with(
    handler: Callable[[httpx.Request], httpx.Response], **kw: Any
) -> tuple[SouqClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    return SouqClient("http://broker:4280", transport=httpx.MockTransport(record), **kw), seen


def test_create_sends_the_body_and_idempotency_key() -> None:
    client, seen = client_with(lambda r: httpx.Response(201, json=MACHINE))
    m = client.create_machine(
        "web",
        "mad",
        MachineConfig.model_validate_json('{"cmd": ["sleep", "1"]}'),
        name="web-1",
        skip_launch=True,
        idempotency_key="k1",
    )
    assert m.id == MACHINE["id"]
    assert m.config.restart.policy == "always"
    request = seen[0]
    assert (request.method, request.url.path) == ("POST", "/v1/apps/web/machines")
    assert request.headers["Idempotency-Key"] == "k1"
    body = json.loads(request.content)
    assert body["region"] == "mad"
    assert body["name"] == "web-1"
    assert body["skip_launch"] is True
    assert body["config"]["cmd"] == ["sleep", "1"]
    plain, seen = client_with(lambda r: httpx.Response(201, json=MACHINE))
    plain.create_machine("web", "mad", {"cmd": ["x"]})
    assert json.loads(seen[0].content) == {"region": "mad", "config": {"cmd": ["x"]}}
    assert "Idempotency-Key" not in seen[0].headers


def test_environment_sets_the_url_and_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import souq.auth.locate

    # No `souq dev` token to fall back on (a dev cluster on this machine leaves one).
    monkeypatch.setattr(souq.auth.locate, "default_dev_dir", lambda: tmp_path)
    monkeypatch.setenv("SOUQ_API", "http://elsewhere:9999/")
    monkeypatch.setenv("SOUQ_TOKEN", "s3cret")
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=[])

    client = SouqClient(transport=httpx.MockTransport(handler))
    assert client.base_url == "http://elsewhere:9999"
    assert client.workers() == []
    assert str(seen[0].url) == "http://elsewhere:9999/v1/workers"
    assert seen[0].headers["Authorization"] == "Bearer s3cret"
    monkeypatch.delenv("SOUQ_API")
    monkeypatch.delenv("SOUQ_TOKEN")
    default = SouqClient(transport=httpx.MockTransport(handler))
    assert default.base_url == "http://127.0.0.1:4280"
    default.workers()
    assert "Authorization" not in seen[-1].headers


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (404, {"error": "machine x not found", "status": "not_found"}, NotFound),
        (409, {"error": "no", "status": "illegal_transition"}, IllegalTransition),
        (408, {"error": "late", "status": "timeout"}, WaitTimeout),
        (503, {"error": "down", "status": "unavailable", "hint": "start it"}, Unavailable),
    ],
)
def test_error_bodies_become_typed_errors(
    status: int, body: dict[str, Any], error: type[SouqError]
) -> None:
    client, _ = client_with(lambda r: httpx.Response(status, json=body))
    with pytest.raises(error) as caught:
        client.get_machine("web", "x")
    assert caught.value.message == body["error"]
    assert caught.value.http_status == status
    assert caught.value.hint == body.get("hint")


def test_insufficient_capacity_keeps_the_placement_record() -> None:
    body = {
        "error": "no worker in region mad can take 4 cpus / 256 MiB: 2 insufficient_cpu",
        "status": "insufficient_capacity",
        "placement": {"request_id": "r", "region": "mad", "rejections": {"insufficient_cpu": 2}},
    }
    client, _ = client_with(lambda r: httpx.Response(409, json=body))
    with pytest.raises(InsufficientCapacity) as caught:
        client.create_machine("web", "mad", {"cmd": ["x"]})
    assert caught.value.details["placement"]["rejections"] == {"insufficient_cpu": 2}


def test_a_body_that_is_not_an_error_body_still_raises() -> None:
    client, _ = client_with(lambda r: httpx.Response(502, text="<html>bad gateway</html>"))
    with pytest.raises(SouqError) as caught:
        client.workers()
    assert caught.value.http_status == 502
    assert "bad gateway" in caught.value.message


def test_an_unreachable_broker_is_unavailable_with_a_hint() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client, _ = client_with(refuse)
    with pytest.raises(Unavailable) as caught:
        client.list_machines("web")
    assert "http://broker:4280" in caught.value.message
    assert caught.value.hint is not None and "souq dev" in caught.value.hint
    with pytest.raises(Unavailable):
        list(client.follow_logs("web", "x"))


def test_commands_use_the_documented_routes() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return httpx.Response(200, json=[])
        if request.url.path.endswith("/logs"):
            return httpx.Response(200, text="out\n")
        return httpx.Response(200, json=MACHINE)

    client, seen = client_with(handler)
    client.start("web", "m1")
    client.stop("web", "m1", signal="SIGTERM", timeout_s=3)
    client.stop("web", "m1")
    client.restart("web", "m1")
    client.signal("web", "m1", "USR1")
    client.destroy("web", "m1", force=True)
    client.destroy("web", "m1")
    client.wait("web", "m1", "stopped", timeout=2.5)
    assert client.logs("web", "m1") == "out\n"
    assert client.events("web", "m1") == []
    calls = [(r.method, r.url.path, r.url.query.decode(), r.content) for r in seen]
    base = "/v1/apps/web/machines/m1"
    assert calls == [
        ("POST", base + "/start", "", b""),
        ("POST", base + "/stop", "", b'{"signal":"SIGTERM","timeout_s":3}'),
        ("POST", base + "/stop", "", b"{}"),
        ("POST", base + "/restart", "", b"{}"),
        ("POST", base + "/signal", "", b'{"signal":"USR1"}'),
        ("DELETE", base, "force=true", b""),
        ("DELETE", base, "", b""),
        ("GET", base + "/wait", "state=stopped&timeout=2.5", b""),
        ("GET", base + "/logs", "", b""),
        ("GET", base + "/events", "", b""),
    ]
    # A wait outlasts its own timeout on the HTTP side.
    wait_timeout = seen[7].extensions["timeout"]
    assert wait_timeout["read"] > 2.5


def test_follow_logs_yields_the_stream() -> None:
    client, seen = client_with(lambda r: httpx.Response(200, content=b"line 1\nline 2\n"))
    assert "".join(client.follow_logs("web", "m1")) == "line 1\nline 2\n"
    assert seen[0].url.query == b"follow=true"
    missing, _ = client_with(
        lambda r: httpx.Response(404, json={"error": "gone", "status": "not_found"})
    )
    with pytest.raises(NotFound):
        list(missing.follow_logs("web", "m1"))


def test_a_refused_token_names_the_file_it_was_read_from(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI picks `souq dev`'s admin.token when SOUQ_TOKEN is unset: a broker that refuses it
    (another cluster's keys) is told apart from a token the user gave."""
    import souq.auth.locate

    (tmp_path / "admin.token").write_text("stale\n")
    monkeypatch.setattr(souq.auth.locate, "default_dev_dir", lambda: tmp_path)
    monkeypatch.delenv("SOUQ_TOKEN", raising=False)
    refused = httpx.Response(
        401, json={"error": "the token is not valid", "status": "unauthorized"}
    )

    client, sent = client_with(lambda _: refused)
    with pytest.raises(SouqError) as caught:
        client.workers()
    assert sent[0].headers["authorization"] == "Bearer stale"
    assert caught.value.status == "unauthorized"
    assert f"the token read from {tmp_path / 'admin.token'}" in str(caught.value)

    monkeypatch.setenv("SOUQ_TOKEN", "given")
    client, _ = client_with(lambda _: refused)
    with pytest.raises(SouqError) as caught:
        client.workers()
    assert "read from" not in str(caught.value)  # the user's own token: no file to name
