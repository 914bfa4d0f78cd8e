"""The names of one worker: its replica of the cluster view, the name index it feeds, and the
DNS server answering from it. ``start()``, then ``await aclose()``.

The replica is the proxy's machinery (:class:`souq.view.ClusterView` with the workers'
liveness): machine events as they come, anti-entropy behind them. Every row change reaches the
index at once (:class:`~souq.network.name_feed.NameFeed`), so a machine that stops has left
the answers by the time its event is applied. The workers' regions are the regions the names
know (``<region>.<app>.internal`` of a known region without machines is empty, not
NXDOMAIN).

On a locked-down bus the replica connects as the worker's ``names-<W>`` user (``souq cluster
add-agent`` makes it: heartbeats, events, the view's sync verbs, the apps' bucket for their
networks; not usage), or as the ``view`` role where the host holds that instead, not as the
agent: an agent's own credential sees its own worker's subjects only, and widening it would let
every worker read every other's records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from souq.bus import Transport
from souq.clock import Clock, SystemClock
from souq.model import Machine, WorkerInfo, WorkerState
from souq.network.app_networks import AppNetworks
from souq.network.dns_server import DnsServer, Forwarder, host_resolvers
from souq.network.name_feed import NameFeed, ScopeOf, default_scope
from souq.network.names import DEFAULT_TTL_S, NameIndex
from souq.view.liveness import Liveness
from souq.view.outage import BusGuard

__all__ = ["NameService", "connect_view", "names_role"]

log = logging.getLogger(__name__)


def names_role(auth_dir: Path | None, worker_id: str | None) -> str | None:
    """The bus user a worker's names read the view as: its own ``names-<W>`` when the auth
    directory holds it, else ``view`` when it holds that; None when it holds neither (and
    ``view`` when there is no auth directory: the bus is open)."""
    from souq.auth.bus import holds
    from souq.auth.files import AuthDir
    from souq.bus.permissions import names_user

    auth = AuthDir.from_env(auth_dir)
    if auth is None:
        return "view"
    if worker_id is not None and holds(auth, names_user(worker_id)):
        return names_user(worker_id)
    return "view" if holds(auth, "view") else None


async def connect_view(
    nats_url: str, auth_dir: Path | None, *, name: str, worker_id: str | None = None
) -> Transport:
    """A connection to the bus as :func:`names_role` says (open without an auth dir)."""
    from souq.auth.bus import daemon_credential
    from souq.bus.nats import connect

    role = names_role(auth_dir, worker_id) or "view"  # none held: the missing view.nk is said
    return await connect(nats_url, name=name, credential=daemon_credential(auth_dir, role))


class NameService:
    """``.internal`` answered on ``listen`` from the view on ``transport``.

    ``upstreams``: the resolvers other names go to, ``(address, port)`` each (default: the
    host's ``resolv.conf``). ``owns_transport``: close it with the service."""

    def __init__(
        self,
        transport: Transport,
        *,
        listen: tuple[str, int],
        clock: Clock | None = None,
        upstreams: Sequence[tuple[str, int]] | None = None,
        upstream_timeout_s: float = 2.0,
        ttl_s: int = DEFAULT_TTL_S,
        nearby: Mapping[str, Sequence[str]] | None = None,
        scope_of: ScopeOf = default_scope,
        sync_interval_s: float = 5.0,
        owns_transport: bool = False,
        on_worker: Callable[[WorkerInfo], None] | None = None,
    ) -> None:
        """``on_worker``: told a worker's record as its heartbeat said, whenever its state
        changes (it joined, went down, came back) or it restarted (the routes between
        workers follow the underlay addresses this way)."""
        from souq.view import ClusterView

        self._transport = transport
        self._owns = owns_transport
        clock = clock or SystemClock()
        self.index = NameIndex(nearby=nearby)
        self.feed = NameFeed(self.index, self._read, scope_of=scope_of)
        # On NATS, the apps' networks from their records (a bucket watched, never asked).
        client = getattr(transport, "client", None)
        self.networks: AppNetworks | None = None
        if client is not None and scope_of is default_scope:
            self.networks = AppNetworks(client, on_change=self.feed.app_changed)
            self.feed.scope_of = self.networks.scope_of
        self.liveness = Liveness(transport, clock, usage=False)
        self.view = ClusterView(
            transport,
            self.liveness,
            clock,
            sync_interval_s=sync_interval_s,
            on_change=self.feed.changed,
            on_worker=self._worker_changed,
        )
        self._on_worker = on_worker
        self.liveness.on_rejoin = self._rejoined
        # Through a NATS outage the answers stay (as the view last was): the worker table is
        # frozen meanwhile, and the view re-synced once the bus is back (the broker's guard).
        self.guard = BusGuard(transport, self.liveness, self.view, rejoin_timeout_s=5.0)
        resolvers = (
            list(upstreams) if upstreams is not None else host_resolvers(exclude=[listen[0]])
        )
        self.server = DnsServer(
            self.index,
            Forwarder(resolvers, timeout_s=upstream_timeout_s),
            listen=listen,
            ttl_s=ttl_s,
        )

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    async def start(self) -> None:
        """Its address first (an :class:`OSError` where it is taken: another server of this
        host answers there, and nothing of the view was read), then the view; until it is
        read, ``.internal`` questions are answered SERVFAIL (tried again), never NXDOMAIN."""
        self.server.synced = False
        await self.server.start()
        try:
            self.guard.install()
            if self.networks is not None:
                self.networks.start()
            await self.view.start()
            await self.liveness.start()
        except BaseException:
            await self.server.aclose()
            await self._close_view()
            raise
        self.server.synced = True

    async def aclose(self) -> None:
        await self.server.aclose()
        await self._close_view()

    async def _close_view(self) -> None:
        await self.guard.close()
        if self.networks is not None:
            await self.networks.close()
        await self.liveness.close()
        await self.view.close()
        if self._owns:
            await self._transport.close()

    def _read(self, machine_id: str) -> Machine | None:
        body = self.view.store.machine_json(machine_id)
        return None if body is None else Machine.model_validate_json(body)

    def _worker_changed(self, worker: str, state: WorkerState, before: WorkerState | None) -> None:
        self.index.set_regions(region for _, region, _ in self.liveness.states())
        self._tell(worker)

    def _rejoined(self, worker: str) -> None:
        self.view.resync_worker(worker)
        self._tell(worker)

    def _tell(self, worker: str) -> None:
        info = self.liveness.info(worker)
        if self._on_worker is not None and info is not None:
            try:
                self._on_worker(info)
            except Exception:  # a failure of the listener's is its own: the names go on
                log.exception("the worker listener failed on %s", worker)
