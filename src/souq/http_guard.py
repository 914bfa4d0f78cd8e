"""Deadlines per connection for the APIs served by uvicorn (the broker's, the proxy's admin).

uvicorn closes a keep-alive connection that stays idle after a response, but it gives a
request as long as it likes to arrive: a client that opens connections and sends its headers
a byte at a time (a slowloris), or never finishes a body, holds each connection for ever, and
it reads headers of any size. :class:`GuardedHttpProtocol` adds to uvicorn's httptools
protocol, per connection, what :class:`~souq.limits.HttpLimits` sets:

* the **head deadline**: from the connection's opening, or a request's first byte, to the end
  of its headers (``header_timeout_s``); and at most ``max_header_bytes`` of them;
* the **body deadline**: ``body_grace_s`` after the headers, plus one second for every
  ``body_min_rate`` bytes received so far (a steady upload goes on, a dribble is cut); it
  does not run while uvicorn itself stopped reading (the app has not taken what came);
* the **write stall**: a client that takes nothing of what is sent to it (its connection's
  buffer stays full) for ``write_stall_s`` is dropped, e.g. a dead reader of an event stream.

A connection past a deadline is answered ``408 request_timeout`` when nothing else is being answered
on it, and closed. These are timers on the event loop: no task per connection. The close lingers
(as nginx's does): the answer is sent with the end of this side's stream, and what the client
still sends is read and dropped for ``LINGER_S``, since a byte arriving at a closed socket resets
the connection, and a reset can discard the answer before the client has read it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from souq.limits import HttpLimits

__all__ = ["GuardedHttpProtocol", "guarded_protocol"]

log = logging.getLogger(__name__)

LINGER_S = 2.0  # how long a dropped connection's late bytes are read and thrown away


class GuardedHttpProtocol(HttpToolsProtocol):
    limits: ClassVar[HttpLimits] = HttpLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._stall: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._body_since = 0.0
        self._body_bytes = 0
        self._lingering: asyncio.TimerHandle | None = None

    # -- the connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        for timer in (self._stall, self._lingering):
            if timer is not None:
                timer.cancel()
        self._stall = self._lingering = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering is None:
            super().data_received(data)  # (else a dropped connection's late bytes: dropped)

    def eof_received(self) -> None:
        if self._lingering is None:
            super().eof_received()
        else:
            self.transport.close()  # the client has sent all it will: the linger ends

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall is None:
            self._stall = self.loop.call_later(self.limits.write_stall_s, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def handle_websocket_upgrade(self) -> None:
        self._disarm()  # the connection is the websocket protocol's from now on
        super().handle_websocket_upgrade()

    # -- a request ---------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if self._deadline is None:  # (a new connection's deadline runs from its opening)
            self._arm(self.limits.header_timeout_s, self._head_late)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._body_since = self.loop.time()
        self._body_bytes = 0
        super().on_headers_complete()
        self._arm(self.limits.body_grace_s, self._body_late)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    # -- the deadlines -----------------------------------------------------------------------

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.limits.max_header_bytes:
            self._drop(
                431,
                "headers_too_large",
                f"the request's head is larger than {self.limits.max_header_bytes} bytes",
            )

    def _head_late(self) -> None:
        self._deadline = None
        limit = self.limits.header_timeout_s
        self._timed_out(f"the request's headers did not arrive within {limit:g}s")

    def _body_late(self) -> None:
        self._deadline = None
        limits = self.limits
        due = self._body_since + limits.body_grace_s + self._body_bytes / limits.body_min_rate
        now = self.loop.time()
        if now < due or self.flow.read_paused:  # it keeps up, or we are the ones not reading
            self._arm(max(due - now, 1.0), self._body_late)
            return
        self._timed_out(
            f"the request's body came slower than {limits.body_min_rate} bytes/s "
            f"after {limits.body_grace_s:g}s"
        )

    def _stalled(self) -> None:
        self._stall = None
        log.info("dropped %s: it read nothing for %gs", self._peer(), self.limits.write_stall_s)
        if self.cycle is not None:
            self.cycle.disconnected = True  # what the app sends from now on is dropped
        self.transport.abort()

    def _timed_out(self, message: str) -> None:
        self._drop(408, "request_timeout", message)

    def _drop(self, status: int, code: str, message: str) -> None:
        """Answer ``status`` if nothing else is being answered here, then close (lingering)."""
        if self.transport.is_closing() or self._lingering is not None:
            return
        log.info("closed %s: %s", self._peer(), message)
        cycle = self.cycle
        answering = cycle is not None and cycle.response_started and not cycle.response_complete
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app (if it runs) gets http.disconnect
        if not answering:
            self.transport.write(_answer(status, code, message))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._lingering = self.loop.call_later(LINGER_S, self.transport.close)

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"


_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def _answer(status: int, code: str, message: str) -> bytes:
    body = json.dumps({"error": message, "status": code}).encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        % (
            status,
            _REASONS[status],
            len(body),
        )
        + b"connection: close\r\n\r\n"
        + body
    )


def guarded_protocol(limits: HttpLimits) -> type[GuardedHttpProtocol]:
    """The protocol class to give uvicorn (``uvicorn.Config(http=...)``) for ``limits``."""
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"limits": limits})
