"""Caps on the long-lived streams a broker serves (``GET /v1/events?follow=true``, ``GET
.../logs?follow=true``): so many per client (its token, or its address on a broker without
tokens), so many in all; past either, 429
``too_many_requests`` before the stream starts. A stream holds its slot until its response is
over, however it ends (the client left, a dead reader was dropped, the broker stops)."""

from __future__ import annotations

from collections import Counter

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from souq.errors import TooManyRequests

__all__ = ["SlotResponse", "StreamSlots"]


class StreamSlots:
    """Slots of something a client holds a while (``what``: streams open, by default; image
    uploads use them too)."""

    def __init__(
        self,
        *,
        per_client: int,
        total: int,
        what: str = "streams open",
        hint: str = "close a stream (events or logs --follow) before opening another",
    ) -> None:
        self.per_client = per_client
        self.total = total
        self.what = what
        self.hint = hint
        self._open: Counter[str] = Counter()
        self._count = 0

    @property
    def open_count(self) -> int:
        return self._count

    def take(self, client: str) -> None:
        """Count a new stream of ``client``, or raise :class:`TooManyRequests`."""
        if self._open[client] >= self.per_client:
            raise TooManyRequests(
                f"{client} has {self.per_client} {self.what} already, the most one client may",
                hint=self.hint,
                details={"limit": self.per_client},
            )
        if self._count >= self.total:
            raise TooManyRequests(
                f"this broker serves {self.total} {self.what} already, the most it will",
                hint="retry later, or through another broker",
                details={"limit": self.total},
            )
        self._open[client] += 1
        self._count += 1

    def release(self, client: str) -> None:
        self._count -= 1
        self._open[client] -= 1
        if self._open[client] <= 0:
            del self._open[client]


class SlotResponse(StreamingResponse):
    """A streaming response that gives its slot back when it is over, however it ends."""

    def __init__(self, *args: object, slots: StreamSlots, client: str, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._slots = slots
        self._client = client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slots.release(self._client)
