"""``souq proxy``: the edge. The relay (:mod:`souq.proxy.downstream` and its peers) answers
requests from the routing table; this module runs what keeps that table true and acts on it:

* a replica of the cluster view (machine events and anti-entropy over NATS) and the workers'
  liveness (heartbeats), feeding the table (:mod:`souq.proxy.machines`);
* wake-ups for requests that find no machine (:mod:`souq.proxy.wake`);
* health checks (:mod:`souq.proxy.health`), the autostop round (:mod:`souq.proxy.idle`) and
  standby failover (:mod:`souq.proxy.standby`);
* an admin port: ``/metrics`` (Prometheus) and ``/decisions`` (what the control plane did, and
  why).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from souq.auth.access import permit_of
from souq.bus import Transport
from souq.clock import Clock, SystemClock
from souq.daemon import cancel_tasks
from souq.model import Machine
from souq.protocol import WorkerClient
from souq.proxy.decisions import Decisions
from souq.proxy.flycast import FlycastApps
from souq.proxy.health import HealthChecks
from souq.proxy.idle import Autostop
from souq.proxy.machines import MachineFeed, http_service, tcp_service
from souq.proxy.standby import Failover
from souq.proxy.table import Backend, RoutingTable
from souq.proxy.wake import Waker
from souq.view import ClusterView
from souq.view.liveness import Liveness

__all__ = ["ControlPlane", "ProxyConfig"]

log = logging.getLogger(__name__)


class ProxyConfig(BaseModel):
    """How one ``souq proxy`` runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nats_url: str
    auth_dir: Path | None = Field(
        default=None, description="the cluster's auth directory (souq cluster init)"
    )
    region: str = Field(min_length=1, max_length=64, description="the proxy's own region")
    listen: tuple[str, int] = ("127.0.0.1", 4281)
    domain: str = Field(default="localhost", description="APP.<domain> routes to app APP")
    flycast: tuple[str, int] | None = Field(
        default=None,
        description="where the host's machines' Flycast connections come (the workers' "
        "[fdaa::4]:4282, souq.proxy.flycast); None: no Flycast",
    )
    admin_port: int = Field(default=0, ge=0, le=65535, description="/metrics, /decisions; 0: off")
    autostop_interval_s: float = Field(default=60.0, gt=0, le=86_400)
    wake_timeout_s: float = Field(default=10.0, gt=0, le=600, description="a request's wait")
    drain_s: float = Field(default=30.0, ge=0, le=3600, description="autostop waits this long")
    down_after_missed: int = Field(default=3, ge=1, le=100)
    sync_interval_s: float = Field(default=5.0, gt=0)


class ControlPlane:
    """Everything of the proxy but the relay, on one transport. ``start()``, hand
    :attr:`table` and :attr:`hooks` to the relay, then ``await aclose()``."""

    def __init__(
        self, config: ProxyConfig, transport: Transport, clock: Clock | None = None
    ) -> None:
        self.config = config
        self._transport = transport
        self._clock = clock or SystemClock()
        workers = WorkerClient(transport)
        self.table = RoutingTable()
        self.decisions = Decisions()
        self.liveness = Liveness(transport, self._clock, down_after_missed=config.down_after_missed)
        self.health = HealthChecks(self.table, self.decisions)
        self.feed = MachineFeed(self.table, self._read, on_backend=self._followed)
        self.failover = Failover(
            self.feed, workers, self.decisions, timeout_s=config.wake_timeout_s
        )
        self.view = ClusterView(
            transport,
            self.liveness,
            self._clock,
            sync_interval_s=config.sync_interval_s,
            on_change=self.feed.changed,
            on_worker=self.failover.worker_changed,
        )
        self.liveness.on_rejoin = self.view.resync_worker
        self.autostop = Autostop(
            self.feed,
            workers,
            self.decisions,
            drain_s=config.drain_s,
            timeout_s=10.0,
            ready_since=self.health.ready_since,
        )
        self.waker = Waker(
            table=self.table,
            workers=workers,
            decisions=self.decisions,
            seen=self._seen,
            waking=self.autostop.hold,
            woken=self.autostop.touch,
            region=config.region,
            timeout_s=config.wake_timeout_s,
        )
        self.hooks = Hooks(self.waker, self.autostop)
        self.flycast = FlycastApps()  # the apps' Flycast addresses, from their machines
        self._tasks: list[asyncio.Task[None]] = []
        # Raw TCP services: edge port -> app, and how to listen (set by the process's main).
        self.tcp_ports: dict[int, str] = {}
        self.listen_tcp: Callable[[str, int], Coroutine[Any, Any, None]] | None = None

    async def start(self) -> None:
        await self.view.start()
        await self.liveness.start()
        loop = asyncio.get_running_loop()
        self._tasks.append(
            loop.create_task(self.autostop.run(self.config.autostop_interval_s), name="autostop")
        )

    async def aclose(self) -> None:
        await cancel_tasks(self._tasks)
        await self.failover.aclose()
        await self.health.aclose()
        await self.liveness.close()
        await self.view.close()

    def _read(self, machine_id: str) -> Machine | None:
        body = self.view.store.machine_json(machine_id)
        return None if body is None else Machine.model_validate_json(body)

    def _seen(self, machine: Machine) -> None:
        """A record straight from a worker (a start's answer): the view and the table now."""
        self.view.apply(machine)

    def _followed(self, machine: Machine, backend: Backend | None) -> None:
        self.failover.machine_changed(machine)
        if backend is None:
            self.health.forget(machine.id)
            return
        self.health.follow(machine)
        self.flycast.note(machine)
        if http_service(machine) is None and (tcp := tcp_service(machine)) is not None:
            self._tcp_port(machine.app, tcp[1])

    def _tcp_port(self, app: str, port: int) -> None:
        """An app's raw TCP service needs its edge port: listen on it, once."""
        owner = self.tcp_ports.get(port)
        if owner == app or self.listen_tcp is None:
            return
        if owner is not None:
            self.decisions.record(
                "tcp_port", app, None, f"edge port {port} already serves app {owner}; not taken"
            )
            return
        self.tcp_ports[port] = app
        task = asyncio.get_running_loop().create_task(self.listen_tcp(app, port))
        self._tasks.append(task)

    def admin_app(self, metrics: Any = None) -> Starlette:
        """``GET /metrics`` (the relay's ``metrics`` text, then the control plane's),
        ``GET /decisions[?app=APP]`` (what it did, and why) and ``GET /backends[?app=APP]``
        (the machines it routes to, as it sees them now)."""
        from prometheus_client import generate_latest

        async def metrics_route(request: Request) -> Response:
            text = (metrics() if metrics is not None else b"") + generate_latest(
                self.decisions.registry
            )
            return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

        async def backends_route(request: Request) -> Response:
            table = self.table
            apps = _apps_asked(request, table.apps())
            body = json.dumps(
                [
                    {
                        "machine_id": b.machine_id,
                        "app": b.app,
                        "region": b.region,
                        "address": f"{b.host}:{b.port}",
                        "state": b.state,
                        "healthy": b.healthy,
                        "cordoned": b.cordoned,
                        "draining": table.is_draining(b.machine_id),
                        "load": table.load(b.machine_id),
                    }
                    for name in apps
                    for b in table.backends(name)
                ]
            )
            return Response(body, media_type="application/json")

        async def decisions_route(request: Request) -> Response:
            apps = _apps_asked(request, [])
            everything = not apps and _token_app(request) is None
            recent = [d for app in apps for d in self.decisions.recent(app)]
            body = json.dumps(self.decisions.recent(None) if everything else recent)
            return Response(body, media_type="application/json")

        return Starlette(
            routes=[
                Route("/metrics", metrics_route),
                Route("/decisions", decisions_route),
                Route("/backends", backends_route),
            ]
        )


def _apps_asked(request: Request, known: list[str]) -> list[str]:
    """The apps an admin route answers about: ``?app=`` or every app, within the token's (an
    app's token learns nothing of another app's machines, not even that it has some)."""
    asked = request.query_params.get("app")
    own = _token_app(request)
    if own is not None:
        return [own] if asked in (None, own) else []
    return [asked] if asked else known


def _token_app(request: Request) -> str | None:
    """The one app the request's token is for (None: every app, or a proxy without auth)."""
    return permit_of(request.scope.get("state")).app


class Hooks:
    """The relay's hooks (:class:`souq.proxy.hooks.ProxyHooks`) over the control plane."""

    def __init__(self, waker: Waker, autostop: Autostop) -> None:
        self._waker = waker
        self._touch = autostop.touch

    async def wake(self, app: str, region: str | None) -> Backend | None:
        return await self._waker.wake(app, region)

    def on_request_done(
        self, app: str, backend: Backend | None, status: int, seconds: float
    ) -> None:
        if backend is not None:
            self._touch(backend.machine_id)
