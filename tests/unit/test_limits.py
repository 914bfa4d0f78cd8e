"""The limits on what a client sends (souq.limits): fields answer 422 naming the field, bodies
over their route's limit 413 before they are read, streams past a client's share 429."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from souq.agent.config import AgentConfig
from souq.apps.config import load_app_config
from souq.broker.app import create_app
from souq.broker.streams import StreamSlots
from souq.bus import MemoryTransport
from souq.errors import InvalidInput, TooManyRequests
from souq.limits import (
    BODY_DEFAULT_BYTES,
    CMD_MAX_ARGS,
    ENV_MAX_COUNT,
    LABELS_MAX_COUNT,
    METADATA_MAX_COUNT,
    HttpLimits,
    size_text,
)

from .broker_fakes import FakeWorker, started_service

pytestmark = pytest.mark.anyio


def body(name: str | None = None, **config: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"region": "mad", "config": {"cmd": ["sleep", "1"], **config}}
    if name is not None:
        out["name"] = name
    return out


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    bus = MemoryTransport()
    service = await started_service(bus, FakeWorker(bus, "wa", cpus=2))
    transport = httpx.ASGITransport(app=create_app(service), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://souq") as client:
        yield client
    await service.close()


BIG = "x" * 70_000
FIELDS = [
    ("env count", body(env={f"K{i}": "v" for i in range(ENV_MAX_COUNT + 1)}), "config.env"),
    ("env size", body(env={"A": BIG}), "config.env"),
    ("env name", body(env={"1BAD": "v"}), "config.env"),
    ("env NUL", body(env={"A": "a\0b"}), "config.env"),
    ("argv count", body(cmd=["echo"] * (CMD_MAX_ARGS + 1)), "config.cmd"),
    ("argv size", body(cmd=["echo", "x" * 140_000]), "config.cmd"),
    (
        "metadata count",
        body(metadata={f"k{i}": "v" for i in range(METADATA_MAX_COUNT + 1)}),
        "config.metadata",
    ),
    ("metadata size", body(metadata={"k": "v" * 20_000}), "config.metadata"),
    ("metadata key", body(metadata={"k" * 200: "v"}), "config.metadata"),
    ("name upper case", body(name="Web-1"), "name"),
    ("name underscore", body(name="web_1"), "name"),
    ("name too long", body(name="a" * 64), "name"),
    ("name ends with -", body(name="web-"), "name"),
]


@pytest.mark.parametrize(("label", "sent", "field"), FIELDS, ids=[f[0] for f in FIELDS])
async def test_a_field_over_its_limit_is_422_naming_it(
    http: httpx.AsyncClient, label: str, sent: dict[str, Any], field: str
) -> None:
    r = await http.post("/v1/apps/web/machines", json=sent)
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["status"] == "invalid_input"
    assert err["error"].startswith(f"{field}: "), err["error"]
    assert [f["field"] for f in err["fields"]] == [field]


async def test_fields_at_their_limits_pass(http: httpx.AsyncClient) -> None:
    sent = body(
        name="a" * 63,
        env={f"K{i}": "v" for i in range(ENV_MAX_COUNT)},
        metadata={f"k{i}": "v" for i in range(METADATA_MAX_COUNT)},
    )
    r = await http.post("/v1/apps/web/machines?dry_run=true", json=sent)
    assert r.status_code == 200, r.text


def test_worker_labels_and_process_groups_are_bounded() -> None:
    labels = {f"k{i}": "v" for i in range(LABELS_MAX_COUNT + 1)}
    with pytest.raises(ValueError, match="labels"):
        AgentConfig(region="mad", nats_url="nats://x", labels=labels)
    with pytest.raises(InvalidInput, match="DNS label"):
        load_app_config('app = "a"\nprimary_region = "mad"\n[processes]\nweb_1 = "sleep 1"\n')


# -- bodies -------------------------------------------------------------------------------------


def padded(size: int) -> bytes:
    """A JSON body of ``size`` bytes."""
    head = b'{"region": "mad", "config": {"cmd": ["sleep", "1"]}, "pad": "'
    return head + b"x" * (size - len(head) - 2) + b'"}'


@pytest.mark.parametrize("path", ["/v1/apps/web/machines", "/v1/apps/web/quotes"])
async def test_a_declared_body_over_the_limit_is_413_unread(
    http: httpx.AsyncClient, path: str
) -> None:
    r = await http.post(path, content=padded(BODY_DEFAULT_BYTES + 1))
    assert r.status_code == 413, r.text
    err = r.json()
    assert err["status"] == "payload_too_large"
    assert size_text(BODY_DEFAULT_BYTES) == "1 MiB"
    assert "1 MiB" in err["error"]
    assert err["limit_bytes"] == BODY_DEFAULT_BYTES
    assert r.headers["connection"] == "close"


@pytest.mark.parametrize("path", ["/v1/apps/web/machines", "/v1/apps/web/quotes"])
async def test_a_chunked_body_is_counted_and_refused_past_the_limit(
    http: httpx.AsyncClient, path: str
) -> None:
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(64):  # 4 MiB offered, in 64 KiB pieces
            sent += 1
            yield b" " * 65536

    r = await http.post(path, content=chunks())
    assert r.status_code == 413, r.text
    assert r.json()["status"] == "payload_too_large"
    assert sent < 64  # refused as it passed the limit, not after reading all of it


async def test_a_body_under_the_limit_is_served(http: httpx.AsyncClient) -> None:
    r = await http.post("/v1/apps/web/machines?dry_run=true", content=padded(BODY_DEFAULT_BYTES))
    assert r.status_code == 422  # read whole and parsed: only the unknown `pad` is wrong
    assert "pad" in r.text


async def test_image_pushes_have_their_own_larger_limit(http: httpx.AsyncClient) -> None:
    r = await http.post("/v1/images", content=b"\0" * (BODY_DEFAULT_BYTES * 2))
    assert r.status_code != 413, r.text


# -- streams ------------------------------------------------------------------------------------


def test_streams_are_capped_per_client_and_in_all() -> None:
    slots = StreamSlots(per_client=2, total=3)
    slots.take("a")
    slots.take("a")
    with pytest.raises(TooManyRequests, match="a has 2 streams open"):
        slots.take("a")
    slots.take("b")
    with pytest.raises(TooManyRequests, match="serves 3 streams"):
        slots.take("c")
    slots.release("a")
    slots.take("c")
    assert slots.open_count == 3


def test_http_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="positive"):
        HttpLimits(header_timeout_s=0)
    with pytest.raises(ValueError, match=">= 1"):
        HttpLimits(streams_per_client=0)
