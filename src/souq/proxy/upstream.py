"""Connections to machines: one request at a time each, kept alive in a bounded pool.

An :class:`UpstreamConnection` sends an exchange's request (the client side writes it) and
parses the machine's response with httptools, turning it into the client's response as it
comes: the head rebuilt (hop-by-hop headers out; ``Via`` and ``X-Request-Id`` in; a
``souq-replay`` header caught), the body streamed with the framing the client needs
(``Content-Length`` passed on, otherwise chunked, or delimited by the close for HTTP/1.0). What
one read of the socket produced goes to the client in one write, and what became of the answer
is told to the client's side (:class:`~souq.proxy.sides.ClientSide`).

When the response ends the connection goes back to the :class:`UpstreamPool` unless the machine
or the request said otherwise: idle connections per machine, last in first out, bounded
(``idle_per_machine``). Last in, first out keeps the warm connections busy and lets the cold
ones reach ``idle_s`` and close (:meth:`UpstreamPool.sweep`, called every second by the relay).
A connection the machine closes while idle leaves the pool at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from http import HTTPStatus
from typing import cast

from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser

from souq.proxy.exchange import HOP_BY_HOP, Exchange, Replay
from souq.proxy.sides import ClientSide

__all__ = ["Address", "UpstreamConnection", "UpstreamPool", "parse_replay"]

Address = tuple[str, int]

# The status line of every status Python names; the machine's own reason phrase is not kept
# (HTTP/1.1 clients ignore it, and HTTP/2 has none).
_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}

# Response headers the proxy reads or rewrites; every other one passes through.
_SPECIAL = HOP_BY_HOP | {b"souq-replay", b"via", b"x-request-id"}


def parse_replay(value: bytes) -> Replay | None:
    """``region=mad`` or ``instance=ID`` (Fly's ``fly-replay`` forms); None if neither."""
    for part in value.split(b";"):
        key, _, target = part.strip().partition(b"=")
        key, target = key.strip().lower(), target.strip()
        if key in (b"region", b"instance") and target:
            return key.decode(), target.decode(errors="replace")
    return None


class UpstreamConnection(asyncio.Protocol):
    __slots__ = (
        "address",
        "blocking",
        "chunk_out",
        "client",
        "client_transport",
        "closed",
        "ex",
        "finished",
        "found",
        "idle_since",
        "informational",
        "lines",
        "out",
        "parser",
        "pool",
        "read_paused",
        "replay",
        "reset_parser",
        "reusable",
        "skip",
        "transport",
        "until_eof",
        "upgrading",
        "uses",
    )

    def __init__(self, pool: UpstreamPool, address: Address) -> None:
        self.pool = pool
        self.address = address
        self.transport: asyncio.Transport | None = None
        self.parser = HttpResponseParser(self)
        self.ex: Exchange | None = None
        self.client: ClientSide | None = None
        self.client_transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        self.lines: list[bytes] = [b""]  # the status line goes first, once it is known
        self.found: dict[bytes, bytes] = {}  # the special headers' values
        self.closed = False
        self.blocking = False  # this connection's full send buffer paused the client's reads
        self.read_paused = False  # the client's full send buffer paused this one's reads
        self.uses = 0
        self.idle_since = 0.0
        self.finished = self.informational = self.upgrading = self.skip = False
        self.chunk_out = self.until_eof = self.reset_parser = self.reusable = False
        self.replay: Replay | None = None

    # -- asyncio -----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        if self.ex is None:  # a machine that talks on an idle connection: drop it
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except HttpParserUpgrade as upgrade:
            self._flush()
            ex, client = self.ex, self.client
            assert ex is not None
            assert client is not None
            self.ex = self.client = None
            self.client_transport = None
            assert self.transport is not None
            client.switch(ex, self.transport, data[upgrade.args[0] :])
            return
        except HttpParserError:
            self._fail("sent a response that is not HTTP/1.1")
            return
        out = self.out
        if out:
            transport = self.client_transport
            if transport is not None:
                transport.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()
        if self.finished:
            self._complete()

    def pause_writing(self) -> None:
        if self.client is not None:
            self.blocking = True
            self.client.pause_for_machine()

    def resume_writing(self) -> None:
        self._unblock()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        ex, client = self.ex, self.client
        if ex is None or client is None:
            self.pool.forget(self)
            return
        self._unblock()
        self.ex = self.client = None
        self.client_transport = None
        if self.skip and self.replay is not None and exc is None:
            client.replay(ex, self.replay)
        elif self.until_eof and exc is None and ex.response_started:
            # A response without framing ends with the machine's close.
            if self.out:
                self._flush_to(client)
            if self.chunk_out:
                client.write(b"0\r\n\r\n")
            client.response_done(ex)
        elif ex.response_started:
            if self.out:
                self._flush_to(client)
            client.upstream_broke(ex)
        else:
            what = "reset the connection" if exc is not None else "closed the connection"
            client.upstream_failed(ex, f"{what} before answering", reused=self.uses > 1)

    # -- what the client side calls ----------------------------------------------------------------

    def attach(self, ex: Exchange, client: ClientSide) -> None:
        self.ex = ex
        self.client = client
        self.client_transport = client.transport
        self.uses += 1
        if client.writing_paused:
            self.pause_reading()

    def pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None and not self.closed:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and self.transport is not None and not self.closed:
            self.read_paused = False
            self.transport.resume_reading()

    def abandon(self) -> None:
        """The client went away: this connection is in the middle of something, drop it."""
        self.ex = self.client = None
        self.client_transport = None
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- httptools ---------------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        low = name.lower()
        if low not in _SPECIAL:
            self.lines += (name, b": ", value, b"\r\n")
            return
        seen = self.found.get(low)
        self.found[low] = value if seen is None else seen + b", " + value

    def on_headers_complete(self) -> None:
        ex = self.ex
        assert ex is not None
        parser = self.parser
        status = parser.get_status_code()
        if status < 200 and status != 101:
            self._informational(ex, status)
            return
        lines = self.lines
        lines[0] = _STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status
        append = lines.append
        found = self.found
        self.lines = [b""]
        if found:
            self.found = {}
        self.chunk_out = self.until_eof = False
        self.reusable = parser.should_keep_alive()
        if found:
            replay = found.get(b"souq-replay")
            if replay is not None and ex.replays == 0 and ex.replayable:
                self.replay = parse_replay(replay)
                if self.replay is not None:
                    self.skip = True
                    return
            length = found.get(b"content-length")
            if length is not None and ex.keep_alive and not ex.http10 and status != 101:
                append(b"Content-Length: %s\r\n" % length)  # the common case, in short
            else:
                self._framing(ex, status, found, append)
            via = found.get(b"via")
            rid = found.get(b"x-request-id")
        else:
            self._framing(ex, status, found, append)
            via = rid = None
        append(b"Via: 1.1 souq\r\n" if via is None else b"Via: %s, 1.1 souq\r\n" % via)
        append(b"X-Request-Id: %s\r\n\r\n" % (rid or ex.request_id))
        ex.status = status
        ex.response_started = True
        self.out.append(b"".join(lines))
        if ex.head_request:
            # httptools cannot be told that a HEAD response has no body: start a new parser.
            self.finished = self.reset_parser = True

    def _framing(
        self,
        ex: Exchange,
        status: int,
        found: dict[bytes, bytes],
        append: Callable[[bytes], None],
    ) -> None:
        """How the body reaches the client: its length as the machine said, chunked, or (for
        HTTP/1.0) until the connection closes; and whether the connection stays open."""
        length = found.get(b"content-length")
        te = found.get(b"transfer-encoding")
        if status == 101:
            self.upgrading = True
            append(b"Connection: Upgrade\r\nUpgrade: %s\r\n" % found.get(b"upgrade", b""))
            return
        if length is not None:
            append(b"Content-Length: %s\r\n" % length)
        elif ex.head_request or status in (204, 304):
            pass
        elif ex.http10:
            ex.keep_alive = False  # the body ends when the client's connection closes
            self.until_eof = te is None
        else:
            self.chunk_out = True
            self.until_eof = te is None
            append(b"Transfer-Encoding: %s\r\n" % (te or b"chunked"))
        if not ex.keep_alive:
            append(b"Connection: close\r\n")
        elif ex.http10:
            append(b"Connection: keep-alive\r\n")

    def on_body(self, data: bytes) -> None:
        if self.skip or self.finished:
            return
        if self.chunk_out:
            self.out.append(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            self.out.append(data)

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        if self.upgrading or self.finished:
            return
        if self.chunk_out:
            self.out.append(b"0\r\n\r\n")
        self.finished = True

    # -- inside ------------------------------------------------------------------------------------

    def _informational(self, ex: Exchange, status: int) -> None:
        self.informational = True
        if status == 100:
            if ex.sent_continue or not ex.expect_continue:
                return
            ex.sent_continue = True
        lines = self.lines
        lines[0] = _STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status
        self.lines = [b""]
        self.found = {}
        self.out.append(b"".join(lines) + b"\r\n")

    def _flush(self) -> None:
        if self.client is not None:
            self._flush_to(self.client)
        else:
            self.out.clear()

    def _flush_to(self, client: ClientSide) -> None:
        out = self.out
        client.transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()

    def _unblock(self) -> None:
        if self.blocking:
            self.blocking = False
            if self.client is not None:
                self.client.resume_for_machine()

    def _complete(self) -> None:
        ex, client = self.ex, self.client
        assert ex is not None
        assert client is not None
        self.finished = False
        if self.reset_parser:
            self.reset_parser = False
            self.parser = HttpResponseParser(self)
        if self.blocking:
            self._unblock()
        self.ex = self.client = None
        self.client_transport = None
        if self.read_paused:
            self.resume_reading()
        if self.reusable and ex.request_done and not self.closed:
            self.pool.checkin(self)
        else:
            self.close()
        replay = self.replay
        if replay is not None:
            self.replay = None
            self.skip = False
            client.replay(ex, replay)
        else:
            client.response_done(ex)

    def _fail(self, what: str) -> None:
        ex, client = self.ex, self.client
        self._unblock()
        self.ex = self.client = None
        self.client_transport = None
        self.close()
        if ex is None or client is None:
            self.out.clear()
            return
        if ex.response_started:
            if self.out:
                self._flush_to(client)
            client.upstream_broke(ex)
        else:
            self.out.clear()
            client.upstream_failed(ex, what, reused=self.uses > 1)


class UpstreamPool:
    """Idle keep-alive connections per machine address, last in first out."""

    def __init__(self, *, per_machine: int, idle_s: float, connect_timeout_s: float) -> None:
        self.per_machine = per_machine
        self.idle_s = idle_s
        self.connect_timeout_s = connect_timeout_s
        self.idle: dict[Address, list[UpstreamConnection]] = {}
        self._loop = asyncio.get_running_loop()
        self.now = self._loop.time()  # a coarse clock, set by every sweep: idle times need no more

    def checkout(self, address: Address) -> UpstreamConnection | None:
        conns = self.idle.get(address)
        while conns:
            conn = conns.pop()
            if not conn.closed:
                return conn
        return None

    async def connect(self, address: Address) -> UpstreamConnection:
        """A new connection (raises OSError or TimeoutError)."""
        async with asyncio.timeout(self.connect_timeout_s):
            _, conn = await self._loop.create_connection(
                lambda: UpstreamConnection(self, address), address[0], address[1]
            )
        return conn

    def checkin(self, conn: UpstreamConnection) -> None:
        conns = self.idle.get(conn.address)
        if conns is None:
            conns = self.idle[conn.address] = []
        if len(conns) >= self.per_machine:
            conn.close()
            return
        conn.idle_since = self.now
        conns.append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        conns = self.idle.get(conn.address)
        if conns and conn in conns:
            conns.remove(conn)

    def sweep(self) -> None:
        """Close the connections idle for longer than ``idle_s``."""
        self.now = now = self._loop.time()
        limit = now - self.idle_s
        for address, conns in list(self.idle.items()):
            for conn in [c for c in conns if c.idle_since < limit or c.closed]:
                conns.remove(conn)
                conn.close()
            if not conns:
                del self.idle[address]

    def has_idle(self, address: Address) -> bool:
        """Whether an idle kept-alive connection to ``address`` is here."""
        return any(not conn.closed for conn in self.idle.get(address, ()))

    def idle_count(self) -> int:
        return sum(len(conns) for conns in self.idle.values())

    def close(self) -> None:
        for conns in self.idle.values():
            for conn in conns:
                conn.close()
        self.idle.clear()
