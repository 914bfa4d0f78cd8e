"""Running a broker: connect to NATS, start the service, serve HTTP, shut down in order.

:func:`serve` is the embeddable form (``souq dev`` runs a broker in its own event loop);
:func:`run` is the daemon (``souq broker``): uvloop, and SIGINT/SIGTERM for an orderly stop.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from souq import daemon
from souq.auth.bus import NatsCredential, daemon_credential
from souq.auth.files import AuthDir
from souq.broker.app import create_app
from souq.broker.config import BrokerConfig
from souq.broker.service import BrokerService
from souq.broker.token_routes import Guard
from souq.bus.nats import NatsTransport, connect
from souq.errors import Unavailable
from souq.http_server import EmbeddedServer, server_config
from souq.jobs.changes import JobMark
from souq.jobs.queue import JobQueue
from souq.jobs.watch import JobListener
from souq.loop_clock import daemon_clock
from souq.model.job import Job, JobChange
from souq.view import EventLog

__all__ = ["run", "serve"]

log = logging.getLogger(__name__)

# How long open connections (e.g. `logs --follow` streams) may hold up a shutdown.
GRACEFUL_SHUTDOWN_S = 2


def _tell_jobs(events: EventLog) -> JobListener:
    """Each job's change as an event of the broker's stream (docs/jobs.md, "Events")."""

    def tell(job: Job, change: JobChange, before: JobMark | None) -> None:
        held_by = job.worker or (before.worker if before is not None else None)
        previous = before.state if before is not None else None
        events.append_job(job, change, previous=previous, worker=held_by)

    return tell


def _bind(host: str, port: int) -> socket.socket:
    """Bind the listening socket here, so that a taken port is an error we can report (uvicorn
    would exit the process)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise Unavailable(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="is another broker or `souq dev` using that port? pick another one",
        ) from exc
    return sock


async def serve(
    config: BrokerConfig,
    *,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve the broker until ``stop`` is set (or for ever). ``ready`` is set once the HTTP
    socket listens and the broker has asked the workers to announce themselves."""
    auth = AuthDir.from_env(config.auth_dir)
    transport = await _connect(config, daemon_credential(config.auth_dir, "broker"))
    clock = daemon_clock()  # real time (a test's broker: set ahead, souq.loop_clock)
    service = BrokerService(transport, config, clock=clock)
    guard = Guard.of(auth, service.nats_client) if auth is not None else None
    jobs = JobQueue(service.nats_client, clock=clock, listener=_tell_jobs(service.view.events))
    sock: socket.socket | None = None
    try:
        sock = _bind(config.listen_host, config.listen_port)
        await service.start()  # (it hooks itself to the transport's outages: souq.view.outage)
        if guard is not None:
            guard.revocations.start()
        jobs.start()
        server = EmbeddedServer(
            server_config(
                create_app(service, guard, jobs),
                limits=config.http_limits,
                host=config.listen_host,
                port=config.listen_port,
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            )
        )
        serving = asyncio.create_task(server.serve([sock]), name="souq-broker-http")
        listening = asyncio.create_task(server.listening.wait(), name="souq-broker-listening")
        stopping = asyncio.create_task((stop or asyncio.Event()).wait(), name="souq-broker-stop")
        try:
            await asyncio.wait({serving, listening}, return_when=asyncio.FIRST_COMPLETED)
            if serving.done():
                serving.result()  # raises the start-up error, if any
                raise Unavailable("the broker's HTTP server stopped at start-up")
            host, port = sock.getsockname()[:2]
            log.info("broker listening on http://%s:%s", host, port)
            if ready is not None:
                ready.set()
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if serving.done():
                serving.result()  # the HTTP server failed: say why
        finally:
            server.should_exit = True
            for task in (listening, stopping):
                task.cancel()
            await asyncio.gather(serving, listening, stopping, return_exceptions=True)
    finally:
        if sock is not None:
            sock.close()
        if guard is not None:
            await guard.close()
        await jobs.close()
        await service.close()
        await transport.close()


async def _connect(config: BrokerConfig, credential: NatsCredential | None) -> NatsTransport:
    # The deadline is kept here as well as in `connect`: nats-py retries a first connection for
    # ever when reconnects are unbounded, and a broker pointed at the wrong URL must say so.
    timeout = config.nats_connect_timeout_s
    try:
        async with asyncio.timeout(timeout):
            return await connect(
                config.nats_url,
                name="souq-broker",
                connect_timeout=timeout - 0.5,  # so that a refusal is told as one
                credential=credential,
            )
    except TimeoutError:
        raise Unavailable(
            f"cannot connect to NATS at {config.nats_url} within {timeout:g}s",
            hint="is the NATS server running? check --nats",
        ) from None


def run(config: BrokerConfig) -> None:
    """Run a broker in the foreground until SIGINT or SIGTERM."""
    daemon.run_until_signalled(lambda stop: serve(config, stop=stop))
