"""The part of a relay that its connections see: the routing table, the admission, the pool of
machines' connections, the metrics, the clock; and what a connection asks of it.

A :class:`RelayCore` is what every connection of one relay holds (``client.relay``): the client's
connections (:mod:`souq.proxy.downstream`), the slow path (:mod:`souq.proxy.dispatch`) and the raw
TCP entries (:mod:`souq.proxy.tcp`) stand on it, and the :class:`~souq.proxy.relay.Relay` above
them all is one, with its listeners and its sweeper. So the connections never import the module
that makes them.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from time import perf_counter

from souq.proxy.admission import Admission
from souq.proxy.config import RelayConfig
from souq.proxy.exchange import Exchange, app_of_host
from souq.proxy.hooks import NoHooks, ProxyHooks
from souq.proxy.metrics import BUCKETS, AppStats, ProxyStats
from souq.proxy.table import Backend, RoutingTable, Slot
from souq.proxy.tunnel import Tunnel
from souq.proxy.upstream import UpstreamPool

__all__ = ["RelayCore"]

_HOSTS_KEPT = 4096
_MISSING = object()


class RelayCore:
    """What the connections of one relay share. Make it inside the running event loop."""

    def __init__(
        self,
        table: RoutingTable,
        hooks: ProxyHooks | None = None,
        *,
        config: RelayConfig | None = None,
        stats: ProxyStats | None = None,
    ) -> None:
        self.config = config = config or RelayConfig()
        self.loop = asyncio.get_running_loop()
        self.table = table
        self.hooks: ProxyHooks = hooks or NoHooks()
        self.region = config.region
        self.suffix = b"." + config.domain.encode("ascii")
        self.keep_bytes = config.replay_body_bytes
        self.max_header_bytes = config.max_header_bytes
        self.stats = stats or ProxyStats()
        self.admission = Admission(
            table,
            self.hooks,
            region=config.region,
            queue_limit=config.queue_limit,
            timeout_s=config.queue_timeout_s,
        )
        self.pool = UpstreamPool(
            per_machine=config.idle_per_machine,
            idle_s=config.upstream_idle_s,
            connect_timeout_s=config.connect_timeout_s,
        )
        self.tunnels: set[Tunnel] = set()
        self.now = self.loop.time()  # a coarse clock for idle times, set every second
        self._hosts: dict[bytes, str | object | None] = {}
        self._on_done = self.hooks.on_request_done
        self.stats.queued = self.admission.queued

    # -- what the connections call -----------------------------------------------------------------

    def app_for(self, host: bytes) -> str | None:
        """The app a ``Host`` names (remembered: a client sends the same few hosts)."""
        app = self._hosts.get(host, _MISSING)
        if app is _MISSING:
            app = app_of_host(host, self.suffix)
            if len(self._hosts) >= _HOSTS_KEPT:
                self._hosts.clear()
            self._hosts[host] = app
        return app  # type: ignore[return-value]

    def stats_for(self, app: str | None) -> AppStats:
        stats = self.stats
        if app is not None:
            found = stats.apps.get(app)
            if found is not None:
                return found
            if self.table.backends(app):
                return stats.app(app)
        return stats.unrouted

    def record(self, ex: Exchange, status: int, backend: Backend | None) -> None:
        """``ex`` is answered: its app's counters (as :meth:`AppStats.done`, inline: this runs
        for every request) and the control plane's hook."""
        seconds = perf_counter() - ex.t0
        stats = ex.stats
        if stats is not None:
            stats.in_flight -= 1
            stats.classes[status // 100 if 100 <= status < 600 else 5] += 1
            stats.buckets[bisect_left(BUCKETS, seconds)] += 1
            stats.seconds += seconds
        self._on_done(ex.app or "", backend, status, seconds)

    def pipe(
        self,
        client: asyncio.Transport,
        machine: asyncio.Transport,
        slot: Slot,
        *,
        to_machine: bytes = b"",
        to_client: bytes = b"",
    ) -> None:
        """Make the two connections a tunnel that holds ``slot`` until it is over."""
        tunnels = self.tunnels
        release = self.admission.release

        def over() -> None:
            release(slot)
            tunnels.discard(tunnel)

        tunnel = Tunnel(client, machine, over, to_machine=to_machine, to_client=to_client)
        tunnels.add(tunnel)
