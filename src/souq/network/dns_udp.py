"""The name server's UDP socket, read in a thread of its own (:class:`UdpReceiver`).

A question whose answer is kept rendered (:mod:`souq.network.dns_server`) is answered from
this thread at once. The agent's event loop, where the server lives, also runs the
heartbeats, the replica of the view and the machines' supervision, and a callback or a blocking
call there can hold it for milliseconds; a name asked again should not wait on that. Every other
datagram is handed to the loop (``call_soon_threadsafe``), which answers it as before and sends
on the same socket.

The thread only reads what the loop writes (the kept renderings and the index's version it
was made at) and sends; it needs the interpreter's lock only for that lookup and the send,
which it gets while the loop waits or sits in a call that lets go of it (a file's write,
SQLite, the loop's own poll).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["UdpReceiver", "bound_udp"]

log = logging.getLogger(__name__)
POLL_S = 0.25  # how often the thread looks whether it was told to stop
MAX_DATAGRAM = 65535


def bound_udp(host: str, port: int) -> socket.socket:
    """A UDP socket bound to ``host:port`` (port 0: the system's choice)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


class UdpReceiver:
    """Reads ``sock`` in a thread: ``kept(datagram, asker)`` gives the answer to send at once
    (None: none kept), else ``on_miss(datagram, peer)`` runs in ``loop``. ``start()``, then
    ``close()`` (the thread ends within :data:`POLL_S`, and the socket is closed)."""

    def __init__(
        self,
        sock: socket.socket,
        kept: Callable[[bytes, str], bytes | None],
        on_miss: Callable[[bytes, Any], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.sock = sock
        self._kept = kept
        self._on_miss = on_miss
        self._loop = loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="souq-names-udp", daemon=True)
        self.sent = 0  # answers this thread sent (only it counts them)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def start(self) -> None:
        self.sock.settimeout(POLL_S)
        self._thread.start()

    def sendto(self, wire: bytes, peer: Any) -> None:
        """An answer from the loop (a question the thread handed it)."""
        with contextlib.suppress(OSError):  # the asker's socket gone: nothing to do
            self.sock.sendto(wire, peer)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._wake()
            self._thread.join(timeout=2 * POLL_S + 1)
        self.sock.close()

    def _wake(self) -> None:
        """An empty datagram to the socket, so that the thread sees it was told to stop now
        rather than at its next poll."""
        host, port = self.address
        if ipaddress.ip_address(host).is_unspecified:
            host = "::1" if self.sock.family == socket.AF_INET6 else "127.0.0.1"
        with contextlib.suppress(OSError), socket.socket(self.sock.family, socket.SOCK_DGRAM) as s:
            s.sendto(b"", (host, port))

    def _run(self) -> None:
        recv, send, kept = self.sock.recvfrom, self.sock.sendto, self._kept
        while not self._stop.is_set():
            try:
                data, peer = recv(MAX_DATAGRAM)
            except TimeoutError:
                continue
            except OSError as exc:
                if not self._stop.is_set():
                    log.warning("the names' UDP socket: %s", exc)
                return
            if self._stop.is_set():
                return
            answer = kept(data, str(peer[0]))
            if answer is not None:
                # Counted before it leaves, so that whoever has it sees it counted.
                self.sent += 1
                try:
                    send(answer, peer)
                except OSError:
                    self.sent -= 1
                continue
            try:
                self._loop.call_soon_threadsafe(self._on_miss, data, peer)
            except RuntimeError:  # the loop is closed: the server is going
                return
