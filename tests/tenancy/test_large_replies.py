"""An answer larger than one NATS message is not lost in silence: the requester is told at once
that it was too large (413 `payload_too_large`), instead of waiting out its deadline."""

from __future__ import annotations

import asyncio
import time

import pytest

from souq.bus.codec import unwrap
from souq.bus.nats import connect
from souq.errors import PayloadTooLarge
from souq.natsserver import NatsServer


def test_an_answer_too_large_for_a_message_is_refused_at_once() -> None:
    with NatsServer() as server:

        async def run() -> float:
            answering = await connect(server.url, name="answering")
            asking = await connect(server.url, name="asking")
            try:

                async def big(subject: str, data: bytes) -> bytes:
                    return b"x" * (answering.client.max_payload + 1)

                await answering.subscribe("souq.worker.w1.list", big)
                await answering.flush()
                started = time.monotonic()
                reply = await asking.request("souq.worker.w1.list", b"{}", timeout=30)
                with pytest.raises(PayloadTooLarge, match="more than one NATS message holds"):
                    unwrap(reply)
                return time.monotonic() - started
            finally:
                await asking.close()
                await answering.close()

        assert asyncio.run(run()) < 10  # told, not timed out (30 s)
