"""One request through the proxy: what the client asked, where it goes, how far it got.

:meth:`Exchange.prepare` reads the request's headers once and builds the head sent to the
machine: the client's headers less the hop-by-hop ones, then ``X-Forwarded-For`` (the client's
address appended), ``X-Forwarded-Proto``, ``X-Forwarded-Host``, ``Via: 1.1 souq`` (appended)
and ``X-Request-Id`` (the client's, or a new one), and the body's framing. Everything here is
plain data and byte strings: no I/O.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from souq.errors import SouqError
from souq.proxy.errors import BadRequest

if TYPE_CHECKING:
    import asyncio

    from souq.proxy.metrics import AppStats
    from souq.proxy.table import Slot

__all__ = [
    "HOP_BY_HOP",
    "IDEMPOTENT",
    "Exchange",
    "Replay",
    "app_of_host",
    "new_request_id",
]

Replay = tuple[str, str]  # where a machine's ``souq-replay`` sends: ("region", R), ("instance", id)

IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})

# The framing and hop-by-hop headers, which the proxy sets itself on each side.
HOP_BY_HOP = frozenset(
    {
        b"content-length",
        b"transfer-encoding",
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"upgrade",
    }
)
# Request headers the proxy reads or rewrites; every other one passes through as it came.
# Hop-by-hop ones are dropped, and so are the forwarding headers a client could forge, which
# the proxy sets itself.
_SPECIAL = HOP_BY_HOP | {
    b"host",
    b"expect",
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-forwarded-host",
    b"x-request-id",
    b"via",
}
_CONNECTION_TOKENS = frozenset({b"close", b"keep-alive", b"upgrade"})

_ID_PREFIX = os.urandom(4).hex().encode()
_ids = itertools.count(1)


def new_request_id() -> bytes:
    """Unique within the process, and across processes by a random prefix; cheap."""
    return _ID_PREFIX + b"%010x" % next(_ids)


def app_of_host(host: bytes, suffix: bytes) -> str | None:
    """``web.localhost:4281`` → ``web`` for the suffix ``.localhost``; None for any other host.
    An app name is one DNS label."""
    name = host.split(b":", 1)[0].lower() if b":" in host else host.lower()
    if not name.endswith(suffix):
        return None
    app = name[: -len(suffix)]
    if not app or b"." in app:
        return None
    try:
        return app.decode("ascii")
    except UnicodeDecodeError:
        return None


class Exchange:
    """The state of one request, from its head to the end of its answer."""

    # Defaults on the class: a new exchange sets only what differs (it is made per request).
    url = b""
    method = b"GET"
    app: str | None = None
    stats: AppStats | None = None
    error: SouqError | None = None
    host = b""
    head = b""
    request_id = b""
    keep_alive = True
    http10 = False
    connection_header = False
    upgrade = False
    head_request = False
    idempotent = True
    chunked = False
    has_body = False
    expect_continue = False
    sent_continue = False
    body_size = 0
    request_done = False
    response_started = False
    response_done = False
    discard = False
    closed = False
    status = 0
    t0 = 0.0
    attempts = 0
    replays = 0
    slot: Slot | None = None
    task: asyncio.Task[Any] | None = None
    tunnel_tail = b""
    replayable = True  # every body byte so far is kept (or there is none)
    kept: list[bytes] | None = None  # the body's pieces, up to ``replay_body_bytes``

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []

    @classmethod
    def refused(cls, error: SouqError, stats: AppStats) -> Exchange:
        """An exchange for bytes that were no request: answered with ``error``, then closed."""
        ex = cls()
        ex.error = error
        ex.keep_alive = False
        ex.request_done = True
        ex.t0 = perf_counter()
        ex.stats = stats
        stats.in_flight += 1
        return ex

    def prepare(self, peer_ip: bytes, app_for: Callable[[bytes], str | None]) -> None:
        """Read the headers; set the app (``app_for`` the Host), the request id, the framing
        and :attr:`head`. A request the proxy cannot forward gets :attr:`error` instead."""
        method = self.method
        self.head_request = method == b"HEAD"
        self.idempotent = method in IDEMPOTENT
        parts, found = _scan(method, self.url, self.headers)
        connection = found.get(b"connection")
        if connection is not None:
            self.connection_header = True
            tokens = {t.strip() for t in connection.lower().split(b",")}
            extra = tokens - _CONNECTION_TOKENS - {b""}
            if extra:  # rare: the headers the client named hop-by-hop are dropped too
                kept = [(n, v) for n, v in self.headers if n.lower() not in extra]
                parts, found = _scan(method, self.url, kept)
        host = found.pop(b"host", b"")
        if not host or b", " in host:
            self.error = BadRequest(
                "a request needs exactly one Host header",
                hint="the Host names the app: APP.<domain>",
            )
            return
        self.host = host
        self.app = app_for(host)
        if found:
            self.request_id = found.get(b"x-request-id") or new_request_id()
            xff = found.get(b"x-forwarded-for")
            via = found.get(b"via")
        else:
            self.request_id = new_request_id()
            xff = via = None
        parts.append(
            b"X-Forwarded-For: %s\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: %s\r\n"
            b"Via: %s\r\nX-Request-Id: %s\r\n"
            % (
                xff + b", " + peer_ip if xff else peer_ip,
                host,
                via + b", 1.1 souq" if via else b"1.1 souq",
                self.request_id,
            )
        )
        if found:
            self._special(parts, found)
            if self.error is not None:
                return
        parts.append(b"\r\n")
        self.head = b"".join(parts)

    def _special(self, parts: list[bytes], found: dict[bytes, bytes]) -> None:
        """The framing, ``Expect``, ``Upgrade`` and ``Connection`` of the request."""
        te = found.get(b"transfer-encoding")
        length = found.get(b"content-length")
        if te is not None:
            self.chunked = self.has_body = True
            parts.append(b"Transfer-Encoding: %s\r\n" % te)
        elif length is not None:
            self.has_body = length.strip() != b"0"
            parts.append(b"Content-Length: %s\r\n" % length)
        expect = found.get(b"expect")
        self.expect_continue = expect is not None and expect.lower() == b"100-continue"
        if self.upgrade:
            if self.method == b"CONNECT":
                self.error = BadRequest("CONNECT is not supported by this proxy")
                return
            self.keep_alive = False  # after an upgrade is refused, the connection is closed
            parts.append(b"Connection: Upgrade\r\nUpgrade: %s\r\n" % found.get(b"upgrade", b""))

    def frame(self, data: bytes) -> bytes:
        """A piece of the request body as the machine must receive it."""
        if self.chunked:
            return b"%x\r\n%s\r\n" % (len(data), data)
        return data

    def replay_bytes(self) -> bytes:
        """The head and every body byte kept (and the last chunk if the body is complete)."""
        kept = self.kept or ()
        if self.chunked:
            pieces = [self.head, *(self.frame(piece) for piece in kept if piece)]
            if self.request_done:
                pieces.append(b"0\r\n\r\n")
            return b"".join(pieces)
        return b"".join((self.head, *kept)) if kept else self.head


def _scan(
    method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[list[bytes], dict[bytes, bytes]]:
    """The request line and the headers that pass through as they came, and the values of
    the special ones (repeated ones joined with commas)."""
    parts = [method, b" ", url, b" HTTP/1.1\r\n"]
    append = parts.append
    found: dict[bytes, bytes] = {}
    for name, value in headers:
        low = name.lower()
        if low not in _SPECIAL:
            parts += (name, b": ", value, b"\r\n")
            continue
        seen = found.get(low)
        found[low] = value if seen is None else seen + b", " + value
        if low == b"host":
            append(b"Host: %s\r\n" % value)
    return parts, found
