"""``Transport.gather_from``: one payload to several subjects, the replies into one inbox."""

from __future__ import annotations

import asyncio

import pytest

from souq.bus import MemoryTransport

pytestmark = pytest.mark.anyio


async def test_memory_gather_from_asks_only_the_named_subjects() -> None:
    bus = MemoryTransport()
    asked: list[str] = []

    def worker(name: str):  # type: ignore[no-untyped-def]
        async def handle(subject: str, data: bytes) -> bytes:
            asked.append(name)
            return name.encode() + b":" + data

        return handle

    for name in ("w1", "w2", "w3"):
        await bus.subscribe(f"souq.worker.{name}.offer", worker(name))
    replies = await bus.gather_from(
        ["souq.worker.w1.offer", "souq.worker.w3.offer", "souq.worker.gone.offer"],
        b"x",
        timeout=5,
    )
    assert sorted(replies) == [b"w1:x", b"w3:x"]  # nobody on `gone`: counted, no reply, no wait
    assert sorted(asked) == ["w1", "w3"]
    assert await bus.gather_from([], b"x", timeout=5) == []


async def test_memory_gather_from_stops_at_the_deadline() -> None:
    bus = MemoryTransport()
    release = asyncio.Event()

    async def fast(subject: str, data: bytes) -> bytes:
        return b"fast"

    async def slow(subject: str, data: bytes) -> bytes:
        await release.wait()
        return b"slow"

    await bus.subscribe("a", fast)
    await bus.subscribe("b", slow)
    assert await bus.gather_from(["a", "b"], b"", timeout=0.05) == [b"fast"]
    release.set()
    await bus.close()
