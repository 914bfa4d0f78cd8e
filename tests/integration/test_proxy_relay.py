"""The proxy's data plane against real machine processes (tests/proxy_echo_app.py) on loopback:
routing, keep-alive, bodies, headers, upgrades, raw TCP, limits and queueing, failures,
replays, drains, wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from souq.proxy import Backend, Relay, RelayConfig, RoutingTable, reuse_port_socket
from souq.testing import eventually
from tests.integration.proxy_harness import (
    Machine,
    RawClient,
    chunked,
    head,
    run,
)

PATTERN = bytes(range(256)) * 256


@pytest.fixture(scope="module")
def machines() -> Iterator[dict[str, Machine]]:
    """m1, m2 in mad and m3 in syd (app web), a1 (app api), t1 (with a raw TCP echo)."""
    fleet = {
        "m1": Machine("m1", "mad"),
        "m2": Machine("m2", "mad"),
        "m3": Machine("m3", "syd"),
        "a1": Machine("a1", "mad"),
        "t1": Machine("t1", "mad", tcp=True),
    }
    try:
        for machine in fleet.values():
            machine.start()
        yield fleet
    finally:
        for machine in fleet.values():
            machine.stop()


@contextlib.asynccontextmanager
async def relay_of(
    *backends: Backend, hooks: Any = None, **config: Any
) -> AsyncIterator[tuple[Relay, int]]:
    table = RoutingTable(rng=random.Random(1))
    for b in backends:
        table.upsert(b)
    async with Relay(table, hooks, config=RelayConfig(region="mad", **config)) as relay:
        yield relay, await relay.listen_http("127.0.0.1", 0)


def client(port: int, host: str = "web.localhost") -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers={"Host": host}, timeout=10
    )


async def held(machine: Machine) -> int:
    async with httpx.AsyncClient() as c:
        return int((await c.get(f"http://127.0.0.1:{machine.port}/held")).text)


async def release(machine: Machine, key: str) -> None:
    async with httpx.AsyncClient() as c:
        await c.get(f"http://127.0.0.1:{machine.port}/release?key={key}")


# -- routing and errors ----------------------------------------------------------------------------


def test_the_host_picks_the_app(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        m1, a1 = machines["m1"], machines["a1"]
        async with relay_of(m1.backend("web"), a1.backend("api")) as (_, port):
            async with client(port) as c:
                web = await c.get("/x")
                api = await c.get("/y", headers={"Host": "API.localhost:4281"})
            assert web.status_code == 200
            assert web.json()["machine"] == "m1"
            assert web.json()["path"] == "/x"
            assert api.json()["machine"] == "a1"

    run(body)


def test_an_unknown_app_is_404_app_not_found(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        async with relay_of(machines["m1"].backend("web")) as (relay, port), client(port) as c:
            for host in ("nope.localhost", "web.example.com", "localhost"):
                r = await c.get("/", headers={"Host": host})
                assert r.status_code == 404
                assert r.headers["content-type"] == "application/json"
                assert r.json()["status"] == "app_not_found"
                assert r.json()["error"]
            assert b'souq_proxy_requests_total{app="",code="4xx"} 3.0' in relay.metrics_text()

    run(body)


def test_no_machine_that_can_serve_is_503_no_machines(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        stopped = machines["m1"].backend("web", state="stopped", autostart=False)
        unhealthy = machines["a1"].backend("api", healthy=False)
        async with (
            relay_of(stopped, unhealthy, queue_timeout_s=0.2) as (_, port),
            client(port) as c,
        ):
            r = await c.get("/", headers={"Host": "web.localhost"})
            assert r.status_code == 503 and r.json()["status"] == "no_machines"
            assert "none is started" in r.json()["error"]
            # Started but failing its checks: the request waits for it, then gives up.
            r = await c.get("/", headers={"Host": "api.localhost"})
            assert r.status_code == 503 and r.json()["status"] == "no_machines"
            assert "health checks" in r.json()["hint"]
        # A machine whose checks pass again while a request waits takes it.
        async with relay_of(unhealthy) as (relay, port), client(port, "api.localhost") as c:
            waiting = asyncio.ensure_future(c.get("/"))
            await eventually(lambda: relay.admission.queued().get("api") == 1, message="the wait")
            relay.table.set_healthy(unhealthy.machine_id, True)
            assert (await waiting).status_code == 200

    run(body)


def test_a_request_that_is_not_http_is_400(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        async with relay_of(machines["m1"].backend("web")) as (_, port):
            raw = await RawClient.open(port)
            await raw.send(
                b"GET / HTTP/1.1\r\nHost: web.localhost\r\n\r\nBLAH\x01 nonsense\r\n\r\n"
            )
            ok = await raw.response()
            bad = await raw.response()
            assert ok.status == 200
            assert bad.status == 400
            assert bad.json()["status"] == "bad_request"
            assert await raw.closed()
            raw = await RawClient.open(port)
            await raw.send(b"GET / HTTP/1.1\r\n\r\n")  # no Host
            assert (await raw.response()).status == 400
            raw = await RawClient.open(port)
            await raw.send(head("/", headers={"X-Big": "x" * 70_000}))
            too_large = await raw.response()
            assert too_large.status == 431
            assert too_large.json()["status"] == "headers_too_large"

    run(body)


# -- HTTP/1.1 --------------------------------------------------------------------------------------


def test_keep_alive_uses_one_connection_to_the_machine(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        a1 = machines["a1"]
        async with relay_of(a1.backend("api")) as (_, port):
            seen = []
            for _ in range(3):  # three client connections, one after the other
                async with client(port, "api.localhost") as c:
                    for _ in range(10):
                        seen.append((await c.get("/")).json())
            assert len({doc["conn"] for doc in seen}) == 1
            assert seen[-1]["connections"] == seen[0]["connections"]
            assert seen[-1]["served_on_conn"] - seen[0]["served_on_conn"] == 29

    run(body)


def test_pipelined_requests_are_answered_in_order(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        async with relay_of(machines["m1"].backend("web")) as (_, port):
            raw = await RawClient.open(port)
            await raw.send(
                head("/one") + head("/two", method="POST", body=b"2") + b"2" + head("/three")
            )
            paths = [(await raw.response()).json()["path"] for _ in range(3)]
            assert paths == ["/one", "/two", "/three"]
            head_answer = await raw.request("/four", method="HEAD")
            assert head_answer.status == 200
            assert head_answer.body == b""
            assert (await raw.request("/five")).json()["path"] == "/five"

    run(body)


def test_http_1_0_clients_get_answers_they_can_read(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        async with relay_of(machines["m1"].backend("web")) as (_, port):
            raw = await RawClient.open(port)  # 1.0 asking to keep the connection
            req = b"GET /stream?mb=0.0625 HTTP/1.0\r\nHost: web.localhost\r\n"
            await raw.send(req + b"Connection: keep-alive\r\n\r\n")
            streamed = await raw.response()  # no chunked framing: until the close
            assert "transfer-encoding" not in streamed.headers
            assert streamed.body == PATTERN
            raw = await RawClient.open(port)
            await raw.send(
                b"GET /a HTTP/1.0\r\nHost: web.localhost\r\nConnection: keep-alive\r\n\r\n"
            )
            first = await raw.response()
            assert first.headers["connection"] == "keep-alive"
            await raw.send(b"GET /b HTTP/1.0\r\nHost: web.localhost\r\n\r\n")
            second = await raw.response()
            assert second.json()["path"] == "/b"
            assert second.headers["connection"] == "close"
            assert await raw.closed()

    run(body)


def test_chunked_bodies_both_ways(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        async with relay_of(machines["m1"].backend("web")) as (_, port):
            raw = await RawClient.open(port)
            pieces = [b"hello ", b"chunked ", b"world"]
            await raw.send(
                head("/up", method="POST", headers={"Transfer-Encoding": "chunked"})
                + chunked(pieces)
            )
            echoed = await raw.response()
            assert echoed.json()["body"] == "hello chunked world"
            down = await raw.request("/stream?mb=0.25")
            assert down.headers["transfer-encoding"] == "chunked"
            assert down.body == PATTERN * 4

    run(body)


def test_large_bodies_stream_intact(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        size = 8 * 2**20
        payload = random.Random(3).randbytes(size)

        async def upload() -> AsyncIterator[bytes]:
            for i in range(0, size, 256 * 1024):
                yield payload[i : i + 256 * 1024]

        async with relay_of(machines["m1"].backend("web")) as (_, port), client(port) as c:
            up = await c.post("/up", content=payload)
            assert up.json()["body_len"] == size
            assert up.json()["body_sha256"] == hashlib.sha256(payload).hexdigest()
            up = await c.post("/up", content=upload())  # chunked, as httpx streams it
            assert up.json()["body_sha256"] == hashlib.sha256(payload).hexdigest()
            for path in ("/fixed?mb=8", "/stream?mb=8"):
                digest = hashlib.sha256()
                async with c.stream("GET", path) as down:
                    async for piece in down.aiter_raw():
                        digest.update(piece)
                assert digest.hexdigest() == hashlib.sha256(PATTERN * 128).hexdigest()

    run(body)


def test_forwarding_headers_and_the_request_id(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        async with relay_of(machines["m1"].backend("web")) as (_, port), client(port) as c:
            r = await c.get("/", headers={"X-Forwarded-For": "1.2.3.4", "X-Request-Id": "abc"})
            seen = dict(r.json()["headers"])
            assert seen["X-Forwarded-For"] == "1.2.3.4, 127.0.0.1"
            assert seen["X-Forwarded-Proto"] == "http"
            assert seen["X-Forwarded-Host"] == "web.localhost"
            assert seen["Via"] == "1.1 souq"
            assert seen["X-Request-Id"] == "abc"
            assert r.headers["x-request-id"] == "abc"
            assert r.headers["via"] == "1.1 souq"
            fresh = await c.get("/")
            assert fresh.headers["x-request-id"] == dict(fresh.json()["headers"])["X-Request-Id"]
            assert fresh.headers["x-request-id"] != "abc"

    run(body)


# -- upgrades and raw TCP --------------------------------------------------------------------------


def test_an_upgrade_pipes_bytes_both_ways(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        async with relay_of(machines["m1"].backend("web")) as (relay, port):
            raw = await RawClient.open(port)
            await raw.send(
                head("/ws", headers={"Connection": "Upgrade", "Upgrade": "echo"}) + b"early "
            )
            switched = await raw.response()
            assert switched.status == 101
            assert switched.headers["upgrade"] == "echo"
            await raw.send(b"bytes")
            got = switched.rest
            while len(got) < len(b"early bytes"):
                got += await raw.reader.read(100)
            assert got == b"early bytes"
            assert relay.table.load("m1") == 1  # the tunnel holds the machine
            await raw.close()
            await eventually(lambda: relay.table.load("m1") == 0, message="the tunnel to close")
            assert not relay.tunnels

    run(body)


def test_a_raw_tcp_service_is_piped_to_a_machine(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        t1 = machines["t1"]
        async with relay_of(t1.backend("tcp")) as (relay, _):
            port = await relay.listen_tcp("127.0.0.1", 0, app="tcp", target_port=t1.tcp_port)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"ping")  # at once: before the machine is even connected
            assert await asyncio.wait_for(reader.readline(), 5) == b"tcp t1\n"
            assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
            writer.write(b"pong")
            assert await asyncio.wait_for(reader.readexactly(4), 5) == b"pong"
            assert relay.table.load("t1") == 1
            writer.close()
            await eventually(lambda: relay.table.load("t1") == 0, message="the pipe to close")

    run(body)


# -- limits, queueing, balancing, drains -----------------------------------------------------------


def test_at_the_hard_limit_a_request_waits_for_room(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        m1 = machines["m1"]
        one = m1.backend("web", soft_limit=1, hard_limit=1)
        async with relay_of(one) as (relay, port), client(port) as c:
            holding = asyncio.ensure_future(c.get("/hold?key=room"))
            await eventually(lambda: held(m1), message="the first request to reach m1")
            waiting = asyncio.ensure_future(c.get("/after"))
            await eventually(lambda: relay.admission.queued() == {"web": 1}, message="the queue")
            assert not waiting.done()
            await release(m1, "room")
            assert (await holding).status_code == 200
            assert (await waiting).json()["path"] == "/after"
            assert relay.admission.queued() == {}

    run(body)


def test_at_the_hard_limit_a_request_gets_503_at_its_deadline(
    machines: dict[str, Machine],
) -> None:
    async def body() -> None:
        m1 = machines["m1"]
        one = m1.backend("web", soft_limit=1, hard_limit=1)
        async with relay_of(one, queue_timeout_s=0.2) as (_, port), client(port) as c:
            holding = asyncio.ensure_future(c.get("/hold?key=deadline"))
            await eventually(lambda: held(m1), message="the first request to reach m1")
            started = asyncio.get_running_loop().time()
            late = await c.get("/late")
            assert asyncio.get_running_loop().time() - started >= 0.19
            assert late.status_code == 503
            assert late.json()["status"] == "no_machines"
            assert "0.2s" in late.json()["error"]
            await release(m1, "deadline")
            assert (await holding).status_code == 200

    run(body)


def test_past_the_soft_limit_requests_spread(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        m1, m3 = machines["m1"], machines["m3"]
        near = m1.backend("web", soft_limit=1, hard_limit=5)
        far = m3.backend("web", soft_limit=1, hard_limit=5)
        async with relay_of(near, far) as (relay, port), client(port) as c:
            first = asyncio.ensure_future(c.get("/hold?key=spread"))
            await eventually(lambda: relay.table.load("m1") == 1, message="m1 to take the first")
            second = asyncio.ensure_future(c.get("/hold?key=spread"))
            await eventually(lambda: relay.table.load("m3") == 1, message="m3 to take the second")
            await release(m1, "spread")
            await release(m3, "spread")
            assert [(await f).json()["machine"] for f in (first, second)] == ["m1", "m3"]

    run(body)


def test_a_draining_machine_takes_nothing_new_and_finishes_what_it_has(
    machines: dict[str, Machine],
) -> None:
    async def body() -> None:
        m1, m2 = machines["m1"], machines["m2"]
        backends = (m1.backend("web"), m2.backend("web"))
        async with relay_of(*backends) as (relay, port), client(port) as c:
            inflight = asyncio.ensure_future(c.get("/hold?key=drain"))
            busy = await eventually(
                lambda: next((m for m in ("m1", "m2") if relay.table.load(m)), None),
                message="a machine to take the request",
            )
            other = "m2" if busy == "m1" else "m1"
            assert relay.table.draining(busy) == 1
            drained = asyncio.ensure_future(relay.wait_drained(busy, 5))
            for _ in range(10):
                assert (await c.get("/")).json()["machine"] == other
            assert not drained.done()
            await release(machines[busy], "drain")
            assert (await inflight).json()["machine"] == busy
            assert await drained

    run(body)


# -- failures, retries, replays --------------------------------------------------------------------


def test_a_machine_that_dies_is_a_502_naming_it() -> None:
    async def body() -> None:
        doomed = Machine("doomed").start()
        try:
            async with relay_of(doomed.backend("web")) as (_, port), client(port) as c:
                r = await c.post("/die", content=b"x")  # not idempotent: no retry
                assert r.status_code == 502
                assert r.json()["status"] == "machine_error"
                assert r.json()["machine_id"] == "doomed"
                assert "doomed" in r.json()["error"]
                # Once its process is gone (a dying one may still hold its listening socket,
                # and a connection to it is reset), nothing listens there: refused, and
                # nowhere else to go.
                assert doomed.process is not None
                await asyncio.to_thread(doomed.process.wait, 10)
                r = await c.get("/")
                assert r.status_code == 502
                assert "refused" in r.json()["error"]
        finally:
            doomed.stop()

    run(body)


def test_a_machine_that_dies_mid_answer_cuts_the_client_off() -> None:
    async def body() -> None:
        doomed = Machine("doomed").start()
        try:
            async with relay_of(doomed.backend("web")) as (relay, port):
                raw = await RawClient.open(port)
                with pytest.raises(ConnectionError):
                    await raw.request("/die-mid")
                assert relay.table.load("doomed") == 0
        finally:
            doomed.stop()

    run(body)


def test_an_idempotent_request_is_retried_once_on_another_machine(
    machines: dict[str, Machine],
) -> None:
    async def body() -> None:
        dead = Machine("dead")  # never started: its port refuses
        m2 = machines["m2"]
        async with relay_of(dead.backend("web"), m2.backend("web")) as (_, port), client(port) as c:
            for _ in range(5):
                r = await c.post("/", content=b"refused means nothing was sent")
                assert r.status_code == 200
                assert r.json()["machine"] == "m2"
            garbage = Machine("garbage").start()
            try:
                async with relay_of(garbage.backend("web")) as (_, port2), client(port2) as c2:
                    r = await c2.get("/garbage")
                    assert r.status_code == 502
                    assert r.json()["machine_id"] == "garbage"
            finally:
                garbage.stop()

    run(body)


def test_souq_replay_sends_the_request_elsewhere(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        m1, m2, m3 = machines["m1"], machines["m2"], machines["m3"]
        backends = (m1.backend("web"), m2.backend("web"), m3.backend("web"))
        async with relay_of(*backends) as (_, port), client(port) as c:
            r = await c.post("/replay?to=region=syd", content=b"the body goes too")
            assert r.status_code == 200
            assert r.json()["machine"] == "m3"
            assert r.json()["body"] == "the body goes too"
            assert "souq-replay" not in r.headers
            r = await c.get("/replay?to=instance=m2")
            assert r.json()["machine"] == "m2"
            r = await c.get("/replay?to=region=lhr")  # nobody there
            assert r.status_code == 503
            assert r.json()["status"] == "no_machines"

    run(body)


# -- wake-ups, metrics, processes ------------------------------------------------------------------


class WakeOnce:
    """A control plane in miniature: starts the stopped machine once, however many ask."""

    def __init__(self, relay_table: list[RoutingTable], backend: Backend) -> None:
        self.tables = relay_table
        self.backend = backend
        self.calls = 0
        self.done: list[tuple[str, int]] = []

    async def wake(self, app: str, region: str | None) -> Backend | None:
        self.calls += 1
        await asyncio.sleep(0.05)  # the machine takes a moment to start
        self.tables[0].upsert(self.backend)
        return self.backend

    def on_request_done(
        self, app: str, backend: Backend | None, status: int, seconds: float
    ) -> None:
        self.done.append((app, status))


def test_a_stopped_machine_is_woken_once_for_many_requests(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        m1 = machines["m1"]
        tables: list[RoutingTable] = []
        hooks = WakeOnce(tables, m1.backend("web"))
        async with relay_of(m1.backend("web", state="stopped"), hooks=hooks) as (relay, port):
            tables.append(relay.table)
            async with client(port) as c:
                answers = await asyncio.gather(*(c.get(f"/{i}") for i in range(8)))
            assert [r.status_code for r in answers] == [200] * 8
            assert hooks.calls == 1
            assert sorted(hooks.done) == [("web", 200)] * 8
            text = relay.metrics_text().decode()
            assert 'souq_proxy_requests_total{app="web",code="2xx"} 8.0' in text
            assert 'souq_proxy_in_flight_requests{app="web"} 0.0' in text

    run(body)


def test_two_listeners_share_a_port_with_so_reuseport(machines: dict[str, Machine]) -> None:
    async def body() -> None:
        m1 = machines["m1"]
        async with (
            relay_of(m1.backend("web")) as (first, port),
            relay_of(m1.backend("web")) as (
                second,
                _,
            ),
        ):
            assert await second.listen_http("127.0.0.1", port) == port
            for _ in range(20):
                async with client(port) as c:
                    assert (await c.get("/")).status_code == 200
            counts = [r.stats.app("web").classes[2] for r in (first, second)]
            assert sum(counts) == 20
            reuse_port_socket("127.0.0.1", port).close()

    run(body)
