"""A raw TCP service's connection (a service port without the ``http`` handler), piped to a
machine of its app.

:class:`TcpEntry` is the protocol of a raw TCP listener
(:meth:`~souq.proxy.relay.Relay.listen_tcp`): it holds the client's bytes, asks the relay for a
machine of its app (waiting, or waking one, as a request does) and a connection to it, trying
another machine once if the first refuses, and makes the two a
:class:`~souq.proxy.tunnel.Tunnel`. Flycast's connections are entries of this
kind too (:class:`~souq.proxy.flycast.FlycastEntry`).
"""

from __future__ import annotations

import asyncio
from typing import cast

from souq.errors import SouqError
from souq.proxy.core import RelayCore
from souq.proxy.table import Slot

__all__ = ["TcpEntry"]


class TcpEntry(asyncio.Protocol):
    """A client of a raw TCP service: piped to a machine of ``app`` once one is found."""

    __slots__ = ("app", "early", "relay", "target_port", "task", "transport")

    def __init__(self, relay: RelayCore, app: str, target_port: int | None) -> None:
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
