"""Flycast: a machine's connection to an app's private address, answered by the edge proxy.

Each app has an address on its network (:func:`souq.network.addresses.flycast_ip`; the name
``<app>.flycast``). A worker sends its machines' TCP connections to their own network's
Flycast addresses to the host's proxy (a DNAT rule per machine, :mod:`souq.network.links`),
which listens at ``--flycast`` (``[fdaa::4]:4282``). For each connection the proxy reads the
address and port the machine asked for (``SO_ORIGINAL_DST``), finds the app and the service
(:class:`FlycastApps`), and hands it to the relay as a raw TCP connection of that app: a
machine that serves takes it, or a stopped one with ``autostart`` is started first, as for a
request at the edge (:mod:`souq.proxy.admission`, :mod:`souq.proxy.wake`), and the bytes are
piped both ways (:mod:`souq.proxy.tcp`, :mod:`souq.proxy.tunnel`).

**Ports.** As Fly's: a service's edge ports (``services[].ports[].port``; HTTP on the proxy's
own port, the default, is port 80 here) reach its ``internal_port``, and the internal port
itself does too.

**Who may.** Only a machine of the app's network reaches the address (the worker's rule
matches its own network's Flycast addresses only); the proxy checks it again, from the
connection's source: an address of the cluster whose network bits are the Flycast address's.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from souq.model import Machine
from souq.network.addresses import flycast_ip, network_bits_of
from souq.proxy.core import RelayCore
from souq.proxy.tcp import TcpEntry

if TYPE_CHECKING:
    import asyncio

    from souq.proxy.table import Slot

__all__ = ["HTTP_PORT", "FlycastApps", "FlycastEntry", "original_destination"]

log = logging.getLogger(__name__)

_SO_ORIGINAL_DST = 80  # IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h), at SOL_IPV6
_SOCKADDR_IN6 = 28  # family, port, flow info, address, scope id
HTTP_PORT = 80  # a service's HTTP at the proxy's own port (no port named): 80 on Flycast


def original_destination(sock: socket.socket) -> tuple[str, int] | None:
    """The address and port a DNAT'd IPv6 connection was made to (None: it was not)."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_IPV6, _SO_ORIGINAL_DST, _SOCKADDR_IN6)
    except OSError:
        return None
    (port,) = struct.unpack_from("!H", raw, 2)
    return socket.inet_ntop(socket.AF_INET6, raw[8:24]), port


class FlycastApps:
    """The apps' Flycast addresses and ports, from their machines' records (each record the
    proxy follows is :meth:`note`\\ d)."""

    def __init__(self) -> None:
        self._apps: dict[str, str] = {}  # Flycast address -> app
        self._ports: dict[str, dict[int, int]] = {}  # app -> {port asked: internal port}
        self.refused = 0  # connections that named no app, or came from another network

    def note(self, machine: Machine) -> None:
        address = machine.address
        if address is None or not address.private_ip or not address.network:
            return
        self._apps[flycast_ip(address.network, machine.app)] = machine.app
        ports = self._ports.setdefault(machine.app, {})
        for service in machine.config.services:
            if not service.ports:
                continue
            ports.setdefault(service.internal_port, service.internal_port)
            for edge in service.ports:
                port = edge.port
                if port is None and "http" in edge.handlers:
                    port = HTTP_PORT
                if port is not None:
                    ports[port] = service.internal_port

    def target(self, source: str, asked: str, port: int) -> tuple[str, int] | None:
        """The app and internal port a connection from ``source`` to ``[asked]:port`` goes to
        (None, counted: no app there, no such port, or the source is of another network)."""
        asked = ipaddress.IPv6Address(asked).compressed
        app = self._apps.get(asked)
        network = network_bits_of(asked)
        internal = self._ports.get(app or "", {}).get(port)
        if app is None or internal is None or network_bits_of(source) != network:
            self.refused += 1
            log.info("flycast: refused %s to [%s]:%d", source, asked, port)
            return None
        return app, internal


class FlycastEntry(TcpEntry):
    """A machine's Flycast connection: to a machine of the app its address names, at the
    internal port of the service it asked for."""

    __slots__ = ("apps", "internal", "ports")

    def __init__(
        self, relay: RelayCore, apps: FlycastApps, ports: Callable[[str, int], int | None]
    ) -> None:
        super().__init__(relay, "", None)
        self.apps = apps
        self.ports = ports  # (machine id, internal port) -> where the proxy reaches it
        self.internal = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = cast("socket.socket | None", transport.get_extra_info("socket"))
        peer = transport.get_extra_info("peername")
        asked = original_destination(sock) if sock is not None else None
        found = None if asked is None or not peer else self.apps.target(peer[0], *asked)
        if found is None:
            transport.close()
            return
        self.app, self.internal = found
        super().connection_made(transport)

    def port_of(self, slot: Slot) -> int:
        port = self.ports(slot.machine_id, self.internal)
        return port if port is not None else slot.address[1]
