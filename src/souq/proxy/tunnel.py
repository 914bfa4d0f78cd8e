"""Two sockets piped to each other: an upgraded HTTP connection, or a raw TCP service.

A :class:`Tunnel` takes over two connected transports (``set_protocol``) and copies bytes both
ways until either side closes. A full send buffer on one side pauses reading on the other;
an end-of-file is passed on as a half close (``write_eof``), and the tunnel is over once both
sides have ended or either one is lost. Its ``on_close`` runs once (the relay gives the
machine's slot back there). It knows nothing of HTTP, machines or the relay.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import cast

__all__ = ["Tunnel", "TunnelEnd"]


class TunnelEnd(asyncio.Protocol):
    """One side of a tunnel: what it reads goes to the other side."""

    __slots__ = ("ended", "peer", "transport", "tunnel")

    def __init__(self, tunnel: Tunnel) -> None:
        self.tunnel = tunnel
        self.transport: asyncio.Transport | None = None
        self.peer: TunnelEnd | None = None
        self.ended = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)

    def eof_received(self) -> bool:
        self.ended = True
        peer = self.peer
        if peer is None or peer.transport is None or peer.ended:
            self.tunnel.close()
            return False
        if peer.transport.can_write_eof():
            with contextlib.suppress(OSError, RuntimeError):
                peer.transport.write_eof()
        return True

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.tunnel.close(abort=exc is not None)


class Tunnel:
    def __init__(
        self,
        client: asyncio.Transport,
        machine: asyncio.Transport,
        on_close: Callable[[], None],
        *,
        to_machine: bytes = b"",
        to_client: bytes = b"",
    ) -> None:
        self._on_close: Callable[[], None] | None = on_close
        self.client = TunnelEnd(self)
        self.machine = TunnelEnd(self)
        self.client.peer, self.machine.peer = self.machine, self.client
        for end, transport in ((self.client, client), (self.machine, machine)):
            end.transport = transport
            transport.set_protocol(end)
        if to_machine:
            machine.write(to_machine)
        if to_client:
            client.write(to_client)
        if client.is_closing() or machine.is_closing():
            self.close()
            return
        client.resume_reading()
        machine.resume_reading()

    @property
    def open(self) -> bool:
        return self._on_close is not None

    def close(self, *, abort: bool = False) -> None:
        for end in (self.client, self.machine):
            if end.transport is not None and not end.transport.is_closing():
                if abort:
                    end.transport.abort()
                else:
                    end.transport.close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()
