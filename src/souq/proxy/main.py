"""``souq proxy`` as a process: NATS, the control plane, the relay's HTTP listener, and the admin
port, until SIGINT or SIGTERM. It logs ``souq proxy listening on http://HOST:PORT`` once it
serves, and whether its relay runs compiled (:mod:`souq.compiled`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from nats.aio.client import Client
from starlette.types import ASGIApp

from souq import daemon
from souq.auth.access import Access
from souq.auth.bus import daemon_credential
from souq.auth.files import AuthDir
from souq.broker.revocations import Revocations
from souq.bus.nats import connect
from souq.compiled import compiled
from souq.errors import Unavailable
from souq.http_limits import BodyLimit
from souq.http_server import EmbeddedServer, server_config
from souq.proxy.config import RelayConfig
from souq.proxy.daemon import ControlPlane, ProxyConfig
from souq.proxy.machines import port_at
from souq.proxy.relay import Relay

__all__ = ["run", "serve"]

log = logging.getLogger(__name__)

NATS_CONNECT_TIMEOUT_S = 10.0


async def serve(
    config: ProxyConfig,
    *,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    transport = await connect(
        config.nats_url,
        name="souq-proxy",
        connect_timeout=NATS_CONNECT_TIMEOUT_S,
        credential=daemon_credential(config.auth_dir, "proxy"),
    )
    plane = ControlPlane(config, transport)
    admin: asyncio.Task[None] | None = None
    try:
        await plane.start()
        relay_config = RelayConfig(
            domain=config.domain, region=config.region, queue_timeout_s=config.wake_timeout_s
        )
        async with Relay(plane.table, plane.hooks, config=relay_config) as relay:
            plane.waker.connected = relay.pool.has_idle
            host, port = config.listen
            try:
                port = await relay.listen_http(host, port, reuse_port=False)
            except OSError as exc:
                raise Unavailable(
                    f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                    hint="is another proxy or `souq dev` using that port? pick another one",
                ) from exc

            async def listen_tcp(app: str, edge_port: int) -> None:
                try:
                    await relay.listen_tcp(host, edge_port, app=app)
                except OSError as exc:
                    plane.decisions.record(
                        "tcp_port", app, None, f"cannot listen on {host}:{edge_port}: {exc}"
                    )
                    return
                log.info("app %s: raw TCP on %s:%d", app, host, edge_port)

            plane.listen_tcp = listen_tcp
            if config.flycast is not None:
                await _listen_flycast(plane, relay, *config.flycast)
            if config.admin_port:
                auth = AuthDir.from_env(config.auth_dir)
                admin = asyncio.create_task(
                    _admin(plane, relay, config.admin_port, auth, lambda: transport.client)
                )
            log.info(
                "souq proxy listening on http://%s:%s (relay %s)",
                host,
                port,
                "compiled" if "souq.proxy.downstream" in compiled() else "interpreted",
            )
            if ready is not None:
                ready.set()
            await (stop or asyncio.Event()).wait()
    finally:
        if admin is not None:
            admin.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await admin
        await plane.aclose()
        await transport.close()


async def _listen_flycast(plane: ControlPlane, relay: Relay, host: str, port: int) -> None:
    """The Flycast listener (souq.proxy.flycast): a machine's connection, at the port of the
    machine the relay claims for it."""

    def port_of(machine_id: str, internal: int) -> int | None:
        machine = plane.feed.machines.get(machine_id)
        return None if machine is None else port_at(machine, internal)

    try:
        await relay.listen_flycast(host, port, plane.flycast, port_of)
    except OSError as exc:
        raise Unavailable(
            f"--flycast [{host}]:{port}: cannot listen there: {exc.strerror or exc}",
            hint="give the address the workers send Flycast to ([fdaa::4]:4282) and a free port",
        ) from exc
    log.info("souq proxy takes Flycast connections on [%s]:%d", host, port)


async def _admin(
    plane: ControlPlane,
    relay: Relay,
    port: int,
    auth: AuthDir | None,
    nats: Callable[[], Client],
) -> None:
    """The admin port: with an auth directory, its routes need a token that is not revoked (the
    proxy watches the brokers' list, as they do); ``/backends`` and ``/decisions`` answer
    about the token's app only (a token of every app: all)."""
    app: ASGIApp = plane.admin_app(relay.metrics_text)
    revocations = None
    if auth is not None:
        verifier = auth.verifier()
        revocations = Revocations(nats, verifier, make=False)
        revocations.start()
        app = Access(app, verifier)
    server = EmbeddedServer(server_config(BodyLimit(app), host="127.0.0.1", port=port))
    try:
        await server.serve()
    finally:
        if revocations is not None:
            await revocations.close()


def run(config: ProxyConfig) -> None:
    """Run a proxy in the foreground until SIGINT or SIGTERM."""
    daemon.run_until_signalled(lambda stop: serve(config, stop=stop))
