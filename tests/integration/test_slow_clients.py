"""Slow and idle clients cannot hold a real broker's (or proxy's) connections for ever: a
request's headers and body have deadlines (408, then the connection is closed), and a client
may hold only so many event streams (429). Each test waits on what the server does, with a
deadline; none sleeps to let a race settle."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import httpx

from souq.broker.config import BrokerConfig
from souq.broker.main import serve
from souq.natsserver import free_port
from souq.proxy import Relay, RelayConfig, RoutingTable

DEADLINE_S = 1.0
WAIT_S = 20.0  # how long a test waits for what must happen (far longer than any deadline)


@contextlib.asynccontextmanager
async def broker(nats_url: str, **settings: object) -> AsyncIterator[int]:
    """A real broker (uvicorn, the guarded protocol) on a free port, in this event loop."""
    port = free_port()
    config = BrokerConfig(nats_url=nats_url, listen_port=port, **settings)  # type: ignore[arg-type]
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(config, ready=ready, stop=stop))
    waiting = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiting}, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    assert ready.is_set(), "the broker did not start"
    try:
        yield port
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_S)


async def dribble(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Send ``data`` a byte at a time, one every 50 ms, until the server hangs up."""
    with contextlib.suppress(ConnectionError):
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)


async def answer_then_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    return await asyncio.wait_for(reader.read(), WAIT_S)


async def healthz(port: int) -> int:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"http://127.0.0.1:{port}/healthz", timeout=5)).status_code


def test_a_slowloris_is_cut_at_the_head_deadline(nats_url: str) -> None:
    async def body() -> None:
        async with broker(nats_url, header_timeout_s=DEADLINE_S) as port:
            t0 = time.monotonic()  # before the connection: the broker's clock starts at accept
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head = b"GET /healthz HTTP/1.1\r\nHost: souq\r\nX-Pad: " + b"a" * 10_000
            sending = asyncio.create_task(dribble(writer, head))
            assert await healthz(port) == 200  # others are served meanwhile
            got = await answer_then_eof(reader)
            assert time.monotonic() - t0 >= DEADLINE_S
            assert got.startswith(b"HTTP/1.1 408"), got
            assert b'"status": "request_timeout"' in got
            assert b"did not arrive within 1s" in got
            sending.cancel()
            writer.close()

    asyncio.run(body())


def test_a_connection_that_sends_nothing_is_closed(nats_url: str) -> None:
    async def body() -> None:
        async with broker(nats_url, header_timeout_s=DEADLINE_S) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            got = await answer_then_eof(reader)
            assert got.startswith(b"HTTP/1.1 408"), got
            writer.close()

    asyncio.run(body())


def test_a_body_that_never_ends_is_cut(nats_url: str) -> None:
    async def body() -> None:
        async with broker(nats_url, body_grace_s=DEADLINE_S) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /v1/apps/web/quotes HTTP/1.1\r\nHost: souq\r\n"
                b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"region"'
            )
            await writer.drain()
            got = await answer_then_eof(reader)
            assert got.startswith(b"HTTP/1.1 408"), got
            assert b"body came slower than" in got
            writer.close()

    asyncio.run(body())


async def open_stream(port: int) -> tuple[bytes, asyncio.StreamWriter]:
    """Ask for the followed event stream; the status line and headers it got."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/events?follow=true HTTP/1.1\r\nHost: souq\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    return head, writer


def test_a_client_gets_429_past_its_streams_and_a_slot_again_once_one_closes(
    nats_url: str,
) -> None:
    async def body() -> None:
        async with broker(nats_url, streams_per_client=3) as port:
            streams = [await open_stream(port) for _ in range(3)]
            assert all(head.startswith(b"HTTP/1.1 200") for head, _ in streams)
            head, extra = await open_stream(port)
            assert head.startswith(b"HTTP/1.1 429"), head
            extra.close()
            assert await healthz(port) == 200  # the API itself is not refused
            streams.pop()[1].close()  # one leaves: its slot comes back once the broker sees it
            deadline = time.monotonic() + WAIT_S
            while True:
                head, again = await open_stream(port)
                if head.startswith(b"HTTP/1.1 200"):
                    break
                again.close()
                assert time.monotonic() < deadline, "the closed stream's slot never came back"
                await asyncio.sleep(0.05)
            again.close()
            for _, writer in streams:
                writer.close()

    asyncio.run(body())


def test_the_proxy_cuts_a_slowloris_too() -> None:
    async def body() -> None:
        config = RelayConfig(header_timeout_s=DEADLINE_S)
        async with Relay(RoutingTable(), config=config) as relay:
            port = await relay.listen_http("127.0.0.1", 0)
            idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head = b"GET / HTTP/1.1\r\nHost: web.localhost\r\nX-Pad: " + b"a" * 10_000
            sending = asyncio.create_task(dribble(writer, head))
            got = await answer_then_eof(reader)
            assert got.startswith(b"HTTP/1.1 408"), got
            assert b"request_timeout" in got
            assert (await answer_then_eof(idle_reader)).startswith(b"HTTP/1.1 408")
            sending.cancel()
            writer.close()
            idle_writer.close()

    asyncio.run(body())
