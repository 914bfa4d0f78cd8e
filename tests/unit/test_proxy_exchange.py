"""What the proxy sends a machine, how it reads hosts and replays, its answers and metrics."""

from __future__ import annotations

import json

import pytest

from souq.proxy.errors import AppNotFound, MachineError, NoMachines, answer
from souq.proxy.exchange import Exchange, app_of_host, new_request_id
from souq.proxy.metrics import ProxyStats, metrics_text
from souq.proxy.upstream import parse_replay


def prepared(
    headers: list[tuple[bytes, bytes]], *, method: bytes = b"GET", upgrade: bool = False
) -> Exchange:
    ex = Exchange()
    ex.method = method
    ex.url = b"/path?q=1"
    ex.headers = headers
    ex.upgrade = upgrade
    ex.prepare(b"10.0.0.9", lambda host: app_of_host(host, b".localhost"))
    return ex


def head_lines(ex: Exchange) -> list[bytes]:
    assert ex.head.endswith(b"\r\n\r\n")
    return ex.head[:-4].split(b"\r\n")


@pytest.mark.parametrize(
    ("host", "app"),
    [
        (b"web.localhost", "web"),
        (b"Web.LocalHost:4281", "web"),
        (b"localhost", None),
        (b".localhost", None),
        (b"a.b.localhost", None),
        (b"web.example.com", None),
        (b"web.localhostx", None),
    ],
)
def test_the_host_names_the_app(host: bytes, app: str | None) -> None:
    assert app_of_host(host, b".localhost") == app


def test_the_head_carries_the_forwarding_headers() -> None:
    ex = prepared([(b"Host", b"web.localhost:4281"), (b"Accept", b"*/*")])
    lines = head_lines(ex)
    assert lines[0] == b"GET /path?q=1 HTTP/1.1"
    assert b"Host: web.localhost:4281" in lines
    assert b"Accept: */*" in lines
    assert b"X-Forwarded-For: 10.0.0.9" in lines
    assert b"X-Forwarded-Proto: http" in lines
    assert b"X-Forwarded-Host: web.localhost:4281" in lines
    assert b"Via: 1.1 souq" in lines
    assert b"X-Request-Id: " + ex.request_id in lines
    assert ex.app == "web"
    assert not ex.has_body


def test_forwarding_headers_append_to_the_client_s_and_its_request_id_is_kept() -> None:
    ex = prepared(
        [
            (b"Host", b"web.localhost"),
            (b"X-Forwarded-For", b"1.1.1.1"),
            (b"Via", b"1.0 corp"),
            (b"X-Request-Id", b"abc"),
            (b"X-Forwarded-Proto", b"https"),
        ]
    )
    lines = head_lines(ex)
    assert b"X-Forwarded-For: 1.1.1.1, 10.0.0.9" in lines
    assert b"Via: 1.0 corp, 1.1 souq" in lines
    assert b"X-Request-Id: abc" in lines
    assert b"X-Forwarded-Proto: https" not in lines
    assert ex.request_id == b"abc"


def test_hop_by_hop_headers_are_dropped_and_the_body_is_framed() -> None:
    ex = prepared(
        [
            (b"Host", b"web.localhost"),
            (b"Connection", b"keep-alive, X-Secret"),
            (b"Keep-Alive", b"timeout=5"),
            (b"X-Secret", b"hush"),
            (b"TE", b"trailers"),
            (b"Transfer-Encoding", b"chunked"),
        ],
        method=b"POST",
    )
    lines = head_lines(ex)
    assert not any(
        line.lower().startswith((b"connection", b"keep-alive", b"te:")) for line in lines
    )
    assert not any(line.startswith(b"X-Secret") for line in lines)
    assert b"Transfer-Encoding: chunked" in lines
    assert ex.chunked
    assert ex.has_body
    assert not ex.idempotent
    assert ex.frame(b"abc") == b"3\r\nabc\r\n"


def test_a_content_length_passes_on() -> None:
    ex = prepared([(b"Host", b"web.localhost"), (b"Content-Length", b"12")], method=b"PUT")
    assert b"Content-Length: 12" in head_lines(ex)
    assert ex.has_body
    assert ex.idempotent
    ex.kept = [b"hello ", b"world!"]
    ex.request_done = True
    assert ex.replay_bytes() == ex.head + b"hello world!"


def test_an_upgrade_keeps_its_headers_and_closes_after_a_refusal() -> None:
    ex = prepared(
        [(b"Host", b"web.localhost"), (b"Connection", b"Upgrade"), (b"Upgrade", b"websocket")],
        upgrade=True,
    )
    lines = head_lines(ex)
    assert b"Connection: Upgrade" in lines
    assert b"Upgrade: websocket" in lines
    assert not ex.keep_alive


@pytest.mark.parametrize("hosts", [[], [b"a.localhost", b"b.localhost"]])
def test_a_request_needs_exactly_one_host(hosts: list[bytes]) -> None:
    ex = prepared([(b"Host", h) for h in hosts])
    assert ex.error is not None
    assert ex.error.http_status == 400
    assert ex.error.status == "bad_request"


def test_request_ids_are_unique() -> None:
    ids = {new_request_id() for _ in range(1000)}
    assert len(ids) == 1000


@pytest.mark.parametrize(
    ("value", "target"),
    [
        (b"region=syd", ("region", "syd")),
        (b"instance=m-123", ("instance", "m-123")),
        (b" Region = lhr ;state=x", ("region", "lhr")),
        (b"elsewhere", None),
        (b"region=", None),
    ],
)
def test_replay_targets(value: bytes, target: tuple[str, str] | None) -> None:
    assert parse_replay(value) == target


def test_error_answers_are_json_with_a_stable_status() -> None:
    raw = answer(AppNotFound.named("web"), request_id=b"r1", keep_alive=False)
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert b"Connection: close" in head
    assert b"X-Request-Id: r1" in head
    assert json.loads(body)["status"] == "app_not_found"
    raw = answer(MachineError.of("m1", "web", "reset the connection"))
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    doc = json.loads(body)
    assert doc["status"] == "machine_error"
    assert doc["machine_id"] == "m1"
    assert "m1" in doc["error"]
    assert NoMachines("x").http_status == 503
    assert answer(NoMachines("x"), head_only=True).endswith(b"\r\n\r\n")


def test_metrics_are_plain_counters_exposed_when_scraped() -> None:
    stats = ProxyStats()
    web = stats.app("web")
    for status, seconds in ((200, 0.0004), (201, 0.003), (503, 2.0)):
        web.in_flight += 1
        web.done(status, seconds)
    web.in_flight += 1
    stats.unrouted.in_flight += 1
    stats.unrouted.done(404, 0.0001)
    text = metrics_text(stats).decode()
    assert 'souq_proxy_requests_total{app="web",code="2xx"} 2.0' in text
    assert 'souq_proxy_requests_total{app="web",code="5xx"} 1.0' in text
    assert 'souq_proxy_requests_total{app="",code="4xx"} 1.0' in text
    assert 'souq_proxy_request_duration_seconds_bucket{app="web",le="0.0005"} 1.0' in text
    assert 'souq_proxy_request_duration_seconds_bucket{app="web",le="+Inf"} 3.0' in text
    assert 'souq_proxy_request_duration_seconds_count{app="web"} 3.0' in text
    assert 'souq_proxy_in_flight_requests{app="web"} 1.0' in text
