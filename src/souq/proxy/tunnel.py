"""Two sockets piped to each other: an upgraded HTTP connection, or a raw TCP service.

A :class:`Tunnel` takes over two connected transports (``set_protocol``) and copies bytes both
ways until either side closes. A full send buffer on one side pauses reading on the other;
an end-of-file is passed on as a half close (``write_eof``), and the tunnel is over once both
sides have ended or either one is lost. Its ``on_close`` runs once (the relay gives the
machine's slot back there).

:class:`TcpEntry` is the protocol of a raw TCP listener (a service port without the ``http``
handler): it holds the client's bytes, asks the relay for a machine of its app and a connection
to it, and makes the two a tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from souq.errors import SouqError

if TYPE_CHECKING:
    from souq.proxy.relay import Relay
    from souq.proxy.table import Slot

__all__ = ["TcpEntry", "Tunnel", "TunnelEnd"]


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


class TcpEntry(asyncio.Protocol):
    """A client of a raw TCP service: piped to a machine of ``app`` once one is found."""

    __slots__ = ("app", "early", "relay", "target_port", "task", "transport")

    def __init__(self, relay: Relay, app: str, target_port: int | None) -> None:
        self.relay = relay
        self.app = app
        self.target_port = target_port
        self.task: asyncio.Task[None] | None = None
        self.transport: asyncio.Transport | None = None
        self.early: list[bytes] = []  # what the client sent before its machine was there

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = client = cast(asyncio.Transport, transport)  # uvloop's: no subclass
        client.pause_reading()
        self.task = self.relay.loop.create_task(self._open(client))

    def data_received(self, data: bytes) -> None:
        # uvloop may hand over what it read with the connection, before the pause took hold.
        self.early.append(data)

    def port_of(self, slot: Slot) -> int:
        """The machine's port the connection goes to."""
        return self.target_port if self.target_port is not None else slot.address[1]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None

    async def _open(self, client: asyncio.Transport) -> None:
        relay = self.relay
        deadline = relay.loop.time() + relay.config.queue_timeout_s
        exclude: tuple[str, ...] = ()
        try:
            slot = await relay.admission.claim(self.app, deadline)
        except SouqError:
            client.close()
            return
        while True:
            port = self.port_of(slot)
            try:
                async with asyncio.timeout(relay.config.connect_timeout_s):
                    machine, held = await relay.loop.create_connection(_Held, slot.address[0], port)
                break
            except (OSError, TimeoutError):
                relay.admission.release(slot)
                if exclude:
                    client.close()
                    return
                exclude = (slot.machine_id,)
                retry = relay.table.claim(self.app, relay.region, exclude=exclude)
                if retry is None:
                    client.close()
                    return
                slot = retry
            except asyncio.CancelledError:
                relay.admission.release(slot)
                raise
        self.task = None
        early, self.early = b"".join(self.early), []
        relay.pipe(client, machine, slot, to_machine=early, to_client=b"".join(held.data))


class _Held(asyncio.Protocol):
    """A new connection to a machine, not read until it joins its tunnel."""

    def __init__(self) -> None:
        self.data: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).pause_reading()

    def data_received(self, data: bytes) -> None:
        self.data.append(data)
