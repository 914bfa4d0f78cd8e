"""The one transport interface: NATS in production, in-memory for unit tests and the simulator.

A handler receives the subject and the payload of a message; when the message expects a reply, the
bytes the handler returns are sent back. Each message is handled in its own task, owned by the
transport, so a slow handler (a ``wait``) never holds up the next message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, Protocol

from souq.errors import Unavailable

__all__ = ["Handler", "Subscription", "Transport", "bus_unavailable", "cancellation_kept"]

Handler = Callable[[str, bytes], Coroutine[Any, Any, bytes | None]]


def bus_unavailable() -> Unavailable:
    """The one error for "the bus is down": every request, gather and API call that needs the bus
    answers it (HTTP 503, ``unavailable``) at once while the connection is lost."""
    return Unavailable(
        "the message bus (NATS) is unreachable; retry shortly",
        hint="the connection is re-established by itself once the NATS server is back",
    )


@contextlib.contextmanager
def cancellation_kept() -> Iterator[None]:
    """Around an await of nats-py (its requests, flushes and watches use ``asyncio.wait_for``):
    on Python 3.11 ``wait_for`` returns the result and drops a cancellation that lands in the
    turn its awaitable completes, and a cancelled loop (a view, a watch) would then go on and a
    close never return. A cancellation asked of the task during the block (its ``cancelling()``
    count went up, and nothing took it back) is raised when the block ends."""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    yield
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError


class Subscription(Protocol):
    async def unsubscribe(self) -> None: ...


class Transport(Protocol):
    @property
    def connected(self) -> bool:
        """Whether messages can flow right now. A transport that can lose its connection (NATS)
        also has ``on_disconnect`` and ``on_reconnect``: lists of callbacks (plain or async)
        that it calls when the connection is lost and when it is back."""
        ...

    async def publish(self, subject: str, data: bytes) -> None:
        """Fire and forget."""
        ...

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        """One reply from one responder. Raises :class:`souq.errors.Unavailable` when nobody
        answers in time or nobody listens."""
        ...

    async def gather(
        self, subject: str, data: bytes, *, expect: int | None, timeout: float
    ) -> list[bytes]:
        """Scatter ``data`` and collect replies until ``expect`` have arrived or ``timeout``
        passes, whichever is first. Never raises for missing replies: the caller counts them."""
        ...

    async def gather_from(
        self, subjects: Sequence[str], data: bytes, *, timeout: float
    ) -> list[bytes]:
        """Send ``data`` to each of ``subjects`` (one responder each, e.g. a sample of workers)
        and collect the replies into one inbox until every subject has answered or ``timeout``
        passes. A subject nobody listens on counts as answered, with no reply. Never raises for
        missing replies: the caller counts them."""
        ...

    async def subscribe(
        self, subject: str, handler: Handler, *, queue: str | None = None
    ) -> Subscription: ...

    async def close(self) -> None: ...
