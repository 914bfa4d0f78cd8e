"""A cancellation that lands in the turn a NATS reply arrives is kept: nats-py awaits its
replies through ``asyncio.wait_for``, which on Python 3.11 returns the reply and drops the
cancellation, and a cancelled loop (a view re-listing its worker, a bucket's watch) would go on
and its close never return."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from souq.bus.nats import NatsTransport
from souq.bus.transport import cancellation_kept


class _AnsweringClient:
    """What the transport needs of a nats-py client: a request answered through wait_for, as
    nats-py's is, whose caller is cancelled in the very turn the answer comes."""

    is_connected = True

    def __init__(self) -> None:
        self.requester: asyncio.Task[Any] | None = None

    def new_inbox(self) -> str:
        return "_INBOX.test"

    async def request(self, subject: str, data: bytes, timeout: float) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        msg = SimpleNamespace(subject=subject, reply="", headers=None, data=b"answer")
        future.set_result(msg)
        assert self.requester is not None
        asyncio.get_running_loop().call_soon(self.requester.cancel)
        return await asyncio.wait_for(future, timeout)


def test_a_request_cancelled_as_its_reply_arrives_stays_cancelled() -> None:
    async def main() -> None:
        client = _AnsweringClient()
        bus = NatsTransport(client)  # type: ignore[arg-type]
        client.requester = asyncio.create_task(bus.request("souq.worker.w1.get", b"", 5))
        with pytest.raises(asyncio.CancelledError):
            await client.requester
        assert client.requester.cancelled()

    asyncio.run(main())


def test_a_deadline_inside_the_block_is_a_timeout_not_a_cancellation() -> None:
    """The block's own deadline cancels the task too, and takes it back: a timeout, as
    without the guard; the task goes on."""

    async def main() -> str:
        with pytest.raises(TimeoutError), cancellation_kept():
            async with asyncio.timeout(0):
                await asyncio.Event().wait()
        with cancellation_kept():
            await asyncio.sleep(0)
        return "went on"

    assert asyncio.run(main()) == "went on"
