"""``NatsTransport.gather_from`` against a real nats-server."""

from __future__ import annotations

import asyncio
import time

from souq.bus.nats import connect


def test_nats_gather_from_collects_one_reply_per_subject(nats_url: str) -> None:
    async def main() -> None:
        workers = await connect(nats_url, name="workers")
        broker = await connect(nats_url, name="broker")
        try:

            def answer(name: str):  # type: ignore[no-untyped-def]
                async def handle(subject: str, data: bytes) -> bytes:
                    return name.encode() + b":" + data

                return handle

            for name in ("w1", "w2", "w3"):
                await workers.subscribe(f"t.worker.{name}.offer", answer(name))
            await workers.flush()
            t0 = time.monotonic()
            replies = await broker.gather_from(
                ["t.worker.w1.offer", "t.worker.w2.offer"], b"x", timeout=5
            )
            assert sorted(replies) == [b"w1:x", b"w2:x"]
            # A subject nobody listens on answers "no responders": counted, no reply, no wait.
            replies = await broker.gather_from(
                ["t.worker.w3.offer", "t.worker.nobody.offer"], b"y", timeout=5
            )
            assert replies == [b"w3:y"]
            assert time.monotonic() - t0 < 2
        finally:
            await broker.close()
            await workers.close()

    asyncio.run(main())


def test_nats_flush_means_new_subscriptions_are_live(nats_url: str) -> None:
    """After ``subscribe`` and ``flush`` another client's request reaches the subscriber:
    never "no responders" (the client library's PING once overtook the queued SUBs of a
    new connection, about one time in twenty)."""

    async def echo(subject: str, data: bytes) -> bytes:
        return data

    async def main() -> None:
        broker = await connect(nats_url, name="broker")
        missed = []
        try:
            for n in range(60):
                workers = await connect(nats_url, name=f"workers-{n}")
                try:
                    subjects = [f"t.live.{n}.{k}" for k in range(3)]
                    for subject in subjects:
                        await workers.subscribe(subject, echo)
                    await workers.flush()
                    replies = await broker.gather_from(subjects, b"x", timeout=5)
                    if len(replies) != len(subjects):
                        missed.append(n)
                finally:
                    await workers.close()
        finally:
            await broker.close()
        assert missed == []

    asyncio.run(main())
