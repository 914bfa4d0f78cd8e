"""The proxy's data plane in one process: the listeners and the sweeper, over what they share.

A :class:`Relay` is the top of the data plane: the :class:`~souq.proxy.core.RelayCore` that its
connections share, with the listeners that make the connections and the sweeper that closes the
idle and the late ones. It serves one :class:`~souq.proxy.table.RoutingTable` (which the control
plane keeps up to date) through any number of listeners: HTTP ones (:meth:`Relay.listen_http`,
``Host: APP.<domain>`` picks the app) and raw TCP ones (:meth:`Relay.listen_tcp`, one app per
port). Every listening socket is bound with ``SO_REUSEPORT``, so several proxy processes can
share a port and the kernel spreads connections between them. :func:`serve` is the whole thing
for one HTTP port, until cancelled.

Usage::

    table = RoutingTable()
    table.upsert(Backend(machine_id="m1", app="web", region="mad", host="127.0.0.1", port=8080))
    async with Relay(table, hooks, config=RelayConfig(region="mad")) as relay:
        port = await relay.listen_http("0.0.0.0", 4281)
        ...
        text = relay.metrics_text()  # for the admin port
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from types import TracebackType
from typing import Any, cast

from souq.proxy import deadlines
from souq.proxy.config import RelayConfig
from souq.proxy.core import RelayCore
from souq.proxy.downstream import ClientConnection
from souq.proxy.flycast import FlycastApps, FlycastEntry
from souq.proxy.hooks import ProxyHooks
from souq.proxy.metrics import ProxyStats, metrics_text
from souq.proxy.table import RoutingTable
from souq.proxy.tcp import TcpEntry

__all__ = ["Relay", "reuse_port_socket", "serve"]

log = logging.getLogger(__name__)

_SWEEP_EVERY_S = 1.0


_FREEBIND = 15  # IP_FREEBIND (linux/in.h): bind an address the host does not hold yet


def reuse_port_socket(
    host: str,
    port: int,
    *,
    backlog: int = 1024,
    reuse_port: bool = True,
    freebind: bool = False,
) -> socket.socket:
    """A listening TCP socket; with ``SO_REUSEPORT`` other processes may bind the same port
    and the kernel spreads new connections between them; with ``freebind`` it is bound even
    while the address is not the host's yet (Flycast's, which the worker puts on its loopback
    as its network starts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if freebind:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IP, _FREEBIND, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Relay(RelayCore):
    """The data plane of one proxy process. Make it inside the running event loop."""

    def __init__(
        self,
        table: RoutingTable,
        hooks: ProxyHooks | None = None,
        *,
        config: RelayConfig | None = None,
        stats: ProxyStats | None = None,
    ) -> None:
        super().__init__(table, hooks, config=config, stats=stats)
        self.clients: set[ClientConnection] = set()
        self._servers: list[asyncio.Server] = []
        self.port = 0  # the first HTTP port bound
        self._sweeper: asyncio.Task[None] | None = None
        self.stats.gauges.update(
            {
                "client_connections": lambda: len(self.clients),
                "tunnels_open": lambda: len(self.tunnels),
                "upstream_idle_connections": self.pool.idle_count,
            }
        )

    # -- listeners ---------------------------------------------------------------------------------

    async def listen_http(
        self, host: str = "127.0.0.1", port: int = 0, *, reuse_port: bool = True
    ) -> int:
        """Serve HTTP on ``host:port``; returns the port bound. With ``reuse_port`` (the
        default) other processes may listen on the same port and share its connections."""
        sock = reuse_port_socket(host, port, backlog=self.config.backlog, reuse_port=reuse_port)
        server = await self.loop.create_server(
            lambda: ClientConnection(self, self.clients), sock=sock, backlog=self.config.backlog
        )
        bound = self._started(server)
        self.port = self.port or bound
        return bound

    async def listen_tcp(
        self,
        host: str,
        port: int,
        *,
        app: str,
        target_port: int | None = None,
        reuse_port: bool = True,
    ) -> int:
        """Pipe every connection on ``host:port`` to a machine of ``app``, at the machine's
        port or ``target_port``; returns the port bound."""
        sock = reuse_port_socket(host, port, backlog=self.config.backlog, reuse_port=reuse_port)
        server = await self.loop.create_server(
            lambda: TcpEntry(self, app, target_port), sock=sock, backlog=self.config.backlog
        )
        return self._started(server)

    async def listen_flycast(
        self, host: str, port: int, apps: FlycastApps, ports: Callable[[str, int], int | None]
    ) -> int:
        """Take the Flycast connections the host's workers send to ``[host]:port``
        (:mod:`souq.proxy.flycast`); returns the port bound."""
        sock = reuse_port_socket(
            host, port, backlog=self.config.backlog, reuse_port=False, freebind=True
        )
        server = await self.loop.create_server(
            lambda: FlycastEntry(self, apps, ports), sock=sock, backlog=self.config.backlog
        )
        return self._started(server)

    def _started(self, server: asyncio.Server) -> int:
        self._servers.append(server)
        if self._sweeper is None:
            self._sweeper = self.loop.create_task(self._sweep())
        sockets: Any = cast(Any, server).sockets  # a list under uvloop, typed as a tuple
        port: int = sockets[0].getsockname()[1]
        return port

    # -- what the control plane may call -----------------------------------------------------------

    async def wait_drained(self, machine_id: str, timeout: float) -> bool:
        """After ``table.draining(machine_id)``: wait until its requests and connections are
        over (True), or ``timeout`` seconds (False)."""
        return await self.admission.wait_drained(machine_id, timeout)

    def metrics_text(self) -> bytes:
        return metrics_text(self.stats)

    async def close(self) -> None:
        """Stop listening, close every connection, cancel every wait."""
        for server in self._servers:
            server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        self.admission.close()
        for client in list(self.clients):
            client.transport.close()
        for tunnel in list(self.tunnels):
            tunnel.close()
        self.pool.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await server.wait_closed()
        self._servers.clear()

    async def __aenter__(self) -> Relay:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _sweep(self) -> None:
        """Close keep-alive connections nobody used for a while, both sides, and a client's
        that is past a deadline for its request (a slowloris)."""
        while True:
            await asyncio.sleep(_SWEEP_EVERY_S)
            self.pool.sweep()
            self.now = self.pool.now
            now = self.now
            limit = now - self.config.client_idle_s
            for client in list(self.clients):
                why = deadlines.late(client, now)
                if why is not None:
                    log.info("closed a client's connection: %s", why)
                    deadlines.time_out(client, why)
                elif (
                    client.active is None
                    and client.parsing is None
                    and not client.queue
                    and client.last_used < limit
                ):
                    client.transport.close()


async def serve(
    listen: str,
    table: RoutingTable,
    hooks: ProxyHooks | None = None,
    *,
    config: RelayConfig | None = None,
    stats: ProxyStats | None = None,
    ready: asyncio.Future[Relay] | None = None,
) -> None:
    """Serve HTTP on ``listen`` (``HOST:PORT``) until cancelled. ``ready`` gets the relay once
    it listens (its bound port is ``relay.port``)."""
    host, _, port = listen.rpartition(":")
    async with Relay(table, hooks, config=config, stats=stats) as relay:
        await relay.listen_http(host.strip("[]") or "127.0.0.1", int(port))
        if ready is not None and not ready.done():
            ready.set_result(relay)
        await asyncio.Event().wait()
