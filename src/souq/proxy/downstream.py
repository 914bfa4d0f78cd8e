"""A client's connection to the proxy: HTTP/1.1 keep-alive, requests answered in order.

httptools parses the client's bytes; each request becomes an :class:`Exchange`, served one at
a time (the *active* one) while pipelined ones wait parsed. The fast path takes a machine from
the table and an idle connection from the pool and writes the head at once (no task, no await);
otherwise :mod:`souq.proxy.dispatch` waits and connects in a task. The body streams as it
arrives (up to ``replay_body_bytes`` of it kept for a retry or a replay), and the machine's
connection (:mod:`souq.proxy.upstream`) streams the answer back, then calls
:meth:`~ClientConnection.response_done` (or ``upstream_failed``, ``upstream_broke``, ``replay``,
``switch`` for an upgrade). Reading pauses for five reasons, each a bit of ``paused``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from time import perf_counter
from typing import cast

from httptools import (
    HttpParserCallbackError,
    HttpParserError,
    HttpParserUpgrade,
    HttpRequestParser,
)

from souq.errors import SouqError
from souq.proxy import dispatch
from souq.proxy.core import RelayCore
from souq.proxy.errors import AppNotFound, BadRequest, HeadersTooLarge, answer
from souq.proxy.exchange import Exchange, Replay
from souq.proxy.sides import ClientSide
from souq.proxy.table import Slot
from souq.proxy.upstream import UpstreamConnection

__all__ = ["ClientConnection"]

log = logging.getLogger(__name__)

PAUSE_BODY = 1  # a waiting exchange holds all the body it may keep
PAUSE_QUEUE = 2  # a pipelined request waits for the one before it
PAUSE_MACHINE = 4  # the machine's send buffer is full
PAUSE_UPGRADE = 8  # what follows an upgrade request waits for the machine's 101
PAUSE_BROKEN = 16  # the bytes could not be parsed: nothing more is read


class ClientConnection(ClientSide):
    __slots__ = (
        "active",
        "body_since",
        "clients",
        "closed",
        "eof",
        "feeding",
        "head_since",
        "header_bytes",
        "last",
        "last_used",
        "parser",
        "parsing",
        "paused",
        "peer_ip",
        "queue",
        "relay",
        "up_out",
        "upstream",
    )

    def __init__(self, relay: RelayCore, clients: set[ClientConnection]) -> None:
        self.relay = relay
        self.clients = clients  # the relay's open ones, this among them while it is open
        self.upstream: UpstreamConnection | None = None  # the active exchange's machine
        self.parser = HttpRequestParser(self)
        self.parsing: Exchange | None = None
        self.last: Exchange | None = None
        self.active: Exchange | None = None
        self.queue: deque[Exchange] = deque()
        self.up_out: list[bytes] = []
        self.peer_ip = b""
        self.paused = 0
        self.header_bytes = 0
        self.feeding = self.closed = self.eof = self.writing_paused = False
        self.last_used = 0.0
        self.head_since = self.body_since = 0.0  # see souq.proxy.deadlines

    # -- asyncio -----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        peer = transport.get_extra_info("peername")
        self.peer_ip = str(peer[0]).encode() if isinstance(peer, tuple) else b"unknown"
        self.last_used = self.head_since = self.relay.now
        self.clients.add(self)

    def data_received(self, data: bytes) -> None:
        if self.paused & PAUSE_UPGRADE:  # bytes for the tunnel, read before the pause held
            self._upgrade_waits(data)
            return
        self.feeding = True
        if self.parsing is None and not self.head_since:  # a new request's first bytes
            self.head_since = self.relay.now
        try:
            self.parser.feed_data(data)
        except HttpParserUpgrade as upgrade:
            self._upgrade_waits(data[upgrade.args[0] :])
        except HttpParserCallbackError as err:
            cause = err.__context__
            if not isinstance(cause, SouqError):
                log.error("the proxy failed on a request", exc_info=cause or err)
                cause = BadRequest("the proxy could not read this request")
            self._unreadable(cause)
        except HttpParserError as err:
            self._unreadable(BadRequest(f"the request is not valid HTTP/1.1 ({err})"))
        self.feeding = False
        out = self.up_out
        if out:
            self.up_out = []
            up = self.upstream
            if up is not None and up.transport is not None:
                up.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def eof_received(self) -> bool:
        if self.parsing is not None or (self.active is None and not self.queue):
            return False
        self.eof = True  # answer what was asked, then close
        return True

    def pause_writing(self) -> None:
        self.writing_paused = True
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.upstream is not None:
            self.upstream.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        relay = self.relay
        self.clients.discard(self)
        ex = self.active
        if ex is not None and not ex.response_done:
            ex.closed = ex.response_done = True
            slot = self._let_go(ex)
            relay.record(ex, 499, slot.backend if slot is not None else None)
        for waiting in self.queue:
            relay.record(waiting, 499, None)
        self.queue.clear()

    # -- httptools ---------------------------------------------------------------------------------

    def on_url(self, url: bytes) -> None:
        ex = self.parsing
        if ex is None:  # the first callback of every request
            self.parsing = ex = Exchange()
            self.header_bytes = 0
        ex.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        ex = self.parsing
        assert ex is not None
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > self.relay.max_header_bytes:
            raise HeadersTooLarge(
                f"the request's headers are larger than {self.relay.max_header_bytes} bytes"
            )
        ex.headers.append((name, value))

    def on_headers_complete(self) -> None:
        ex = self.parsing
        assert ex is not None
        parser = self.parser
        relay = self.relay
        ex.t0 = perf_counter()
        self.head_since = 0.0
        self.body_since = relay.now
        ex.method = parser.get_method()
        keep_alive = parser.should_keep_alive()
        ex.keep_alive = keep_alive and not self.eof
        ex.upgrade = parser.should_upgrade()
        ex.prepare(self.peer_ip, relay.app_for)
        if not keep_alive or ex.connection_header:
            # Without a Connection header only HTTP/1.1 keeps the connection open by default.
            ex.http10 = parser.get_http_version() == "1.0"
        stats = relay.stats.apps.get(ex.app) if ex.app is not None else None
        if stats is None:
            stats = relay.stats_for(ex.app)
        ex.stats = stats
        stats.in_flight += 1
        if self.active is None:
            self._start(ex)
        else:
            self.queue.append(ex)

    def on_body(self, data: bytes) -> None:
        ex = self.parsing
        assert ex is not None
        if ex.discard:
            return
        size = ex.body_size = ex.body_size + len(data)
        up = self.upstream if ex is self.active else None
        if ex.replayable:
            keep = self.relay.keep_bytes
            if up is None or size <= keep:
                if ex.kept is None:
                    ex.kept = [data]
                else:
                    ex.kept.append(data)
                if up is None and size > keep:
                    self._pause(PAUSE_BODY)  # all of it is kept until a machine takes it
            else:
                ex.replayable = False
                ex.kept = None
        if up is not None:
            self._send_up(ex, b"%x\r\n%s\r\n" % (len(data), data) if ex.chunked else data)

    def on_message_complete(self) -> None:
        ex = self.parsing
        assert ex is not None
        self.parsing = None
        self.last = ex
        ex.request_done = True
        if ex.chunked and not ex.discard and ex is self.active and self.upstream is not None:
            self._send_up(ex, b"0\r\n\r\n")
        if ex is self.active:
            if ex.response_done:
                self._finish(ex)
        elif not ex.response_done:
            self._pause(PAUSE_QUEUE)

    # -- serving an exchange -----------------------------------------------------------------------

    def _start(self, ex: Exchange) -> None:
        self.active = ex
        if ex.error is not None:
            self.answer(ex, ex.error)
            return
        if ex.app is None:
            self.answer(ex, AppNotFound(f"no app is served at {ex.host.decode(errors='replace')}"))
            return
        relay = self.relay
        slot = relay.admission.try_claim(ex.app)
        if slot is not None:
            conn = relay.pool.checkout(slot.address)
            if conn is not None:
                self.attach(ex, slot, conn)
                return
        self.later(ex, slot)

    def later(self, ex: Exchange, slot: Slot | None, *, fresh: bool = False) -> None:
        """The slow path, in a task: wait for a machine, connect, then :meth:`attach`."""
        ex.task = self.relay.loop.create_task(dispatch.serve_later(self, ex, slot, fresh=fresh))

    def attach(self, ex: Exchange, slot: Slot, conn: UpstreamConnection) -> None:
        ex.slot = slot
        self.upstream = conn
        conn.attach(ex, self)
        if ex.expect_continue and not ex.sent_continue and not ex.body_size:
            ex.sent_continue = True
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if ex.kept or ex.chunked:
            self._send_up(ex, ex.replay_bytes())
            if ex.body_size > self.relay.keep_bytes:
                ex.replayable = False
                ex.kept = None
        else:
            self._send_up(ex, ex.head)
        if self.paused & PAUSE_BODY:
            self._resume(PAUSE_BODY)

    def _send_up(self, ex: Exchange, data: bytes) -> None:
        if self.feeding and ex is self.active:
            self.up_out.append(data)
        elif self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.write(data)

    def answer(self, ex: Exchange, err: SouqError) -> None:
        """Answer ``ex`` with an error of the proxy's own."""
        ex.replayable = False
        ex.kept = None
        ex.discard = True
        if not ex.request_done and ex.has_body:
            ex.keep_alive = False  # rather than read a body nobody wants
        ex.status = err.http_status
        ex.response_started = True
        raw = answer(
            err, request_id=ex.request_id, keep_alive=ex.keep_alive, head_only=ex.head_request
        )
        self.transport.write(raw)
        self.response_done(ex)

    def _finish(self, ex: Exchange) -> None:
        """``ex`` is answered and its request read: on to the next one, or close."""
        self.active = None
        if not ex.keep_alive or self.closed:
            self._close()
            return
        self.last_used = self.relay.now
        queue = self.queue
        if queue:
            nxt = queue.popleft()
            if not queue:
                self._resume(PAUSE_QUEUE)
            self._start(nxt)
        else:
            if self.eof:
                self._close()
                return
            if self.paused & PAUSE_QUEUE:
                self._resume(PAUSE_QUEUE)

    def release(self, ex: Exchange) -> Slot | None:
        slot = ex.slot
        if slot is not None:
            ex.slot = None
            self.relay.admission.release(slot)
        return slot

    def _let_go(self, ex: Exchange) -> Slot | None:
        """Stop serving ``ex`` wherever it is: its task, its machine's connection, its slot."""
        if ex.task is not None:
            ex.task.cancel()
            ex.task = None
        if self.upstream is not None:
            self.upstream.abandon()
            self.upstream = None
        return self.release(ex)

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()

    def _pause(self, why: int) -> None:
        if not self.paused and not self.closed:
            self.transport.pause_reading()
        self.paused |= why

    def _resume(self, why: int) -> None:
        if self.paused & why:
            self.paused &= ~why
            if not self.paused and not self.closed:
                self.transport.resume_reading()

    def _upgrade_waits(self, tail: bytes) -> None:
        """The request before ``tail`` asked for an upgrade: hold the bytes that follow."""
        ex = self.last
        if ex is not None and ex.upgrade and not ex.response_done:
            ex.tunnel_tail += tail
        self._pause(PAUSE_UPGRADE)

    def _unreadable(self, err: SouqError) -> None:
        """The bytes cannot be parsed: answer what came before, then ``err``, then close."""
        self._pause(PAUSE_BROKEN)
        ex, self.parsing = self.parsing, None
        if ex is not None and ex is self.active and not ex.response_done:
            ex.keep_alive = False
            self._let_go(ex)
            ex.request_done = True
            if ex.response_started:
                self.relay.record(ex, 400, None)
                self._close()
            else:
                self.answer(ex, err)
            return
        if ex is not None and ex in self.queue:
            self.queue.remove(ex)
            self.relay.record(ex, 400, None)
        broken = Exchange.refused(err, self.relay.stats.unrouted)
        if self.active is None:
            self._start(broken)
        else:
            self.queue.append(broken)

    # -- what the machine's connection calls -------------------------------------------------------

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def pause_for_machine(self) -> None:
        self._pause(PAUSE_MACHINE)

    def resume_for_machine(self) -> None:
        self._resume(PAUSE_MACHINE)

    def response_done(self, ex: Exchange) -> None:
        ex.response_done = True
        self.upstream = None
        relay = self.relay
        slot = ex.slot
        if slot is None:
            relay.record(ex, ex.status, None)
        else:
            ex.slot = None
            relay.admission.release(slot)
            relay.record(ex, ex.status, slot.backend)
        if ex.request_done:
            self._finish(ex)
        else:
            ex.discard = True  # the rest of the body is read and dropped
            ex.replayable = False
            ex.kept = None

    def upstream_failed(self, ex: Exchange, what: str, *, reused: bool) -> None:
        """The machine failed before the client got a byte: retry once, or answer 502."""
        self.upstream = None
        dispatch.retry_or_fail(self, ex, what, reused=reused)

    def upstream_broke(self, ex: Exchange) -> None:
        """The machine failed in the middle of its answer: the client's connection is cut."""
        self.upstream = None
        ex.response_done = True
        slot = self.release(ex)
        self.relay.record(ex, 502, slot.backend if slot is not None else None)
        self.active = None
        self._close()

    def replay(self, ex: Exchange, target: Replay) -> None:
        """The machine asked (``souq-replay``) for the request to go elsewhere."""
        self.upstream = None
        dispatch.replay(self, ex, target)

    def switch(self, ex: Exchange, machine: asyncio.Transport, tail: bytes) -> None:
        """The machine answered 101: from now on the two sockets are piped to each other."""
        relay = self.relay
        self.upstream = None
        ex.response_done = True
        slot = ex.slot
        ex.slot = None
        relay.record(ex, 101, slot.backend if slot is not None else None)
        self.active = None
        self.closed = True
        self.clients.discard(self)
        assert slot is not None
        relay.pipe(self.transport, machine, slot, to_machine=ex.tunnel_tail, to_client=tail)
