"""``BucketWatch`` against a real nats-server that restarts under it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from souq.bus.jetstream import BucketWatch, reconnects
from souq.bus.nats import connect
from souq.natsserver import NatsServer
from souq.testing import eventually


async def _until(condition: Callable[[], object], what: str) -> None:
    await eventually(condition, timeout=15.0, message=what)


def test_a_watch_sees_what_is_written_after_nats_restarted() -> None:
    """NATS restarts with its store kept; a key written after it is back reaches the watch
    (a watch's consumer does not survive the server: the watch starts again on reconnection)."""

    async def main(server: NatsServer) -> None:
        transport = await connect(server.url, name="watcher", reconnect_wait_s=0.1)
        js = transport.client.jetstream()
        await js.create_key_value(bucket="souq-test-watch")
        seen: list[str] = []
        synced: list[bool] = []

        async def bucket():  # type: ignore[no-untyped-def]
            return await js.key_value("souq-test-watch")

        watch = BucketWatch(
            bucket,
            lambda entry: seen.append(entry.key),
            name="test-watch",
            on_synced=lambda: synced.append(True),
            reconnects=lambda: reconnects(transport.client),
            check_s=0.1,
        )
        watch.start()
        try:
            await (await bucket()).put("before", b"1")
            await _until(lambda: "before" in seen, "the key written before the restart")
            await asyncio.to_thread(server.stop, keep_store=True)
            await asyncio.to_thread(server.start)
            await _until(lambda: transport.connected, "the connection back")
            await (await bucket()).put("after", b"2")
            await _until(lambda: "after" in seen, "the key written after the restart")
            # A second first pass: the watch started again. "after" may be one of the entries
            # of that pass, seen before the marker that ends it: the end is waited for.
            await _until(lambda: len(synced) >= 2, "the watch to start again")
        finally:
            await watch.close()
            await transport.close()

    with NatsServer() as server:
        asyncio.run(main(server))
