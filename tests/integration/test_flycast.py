"""Flycast (docs/network.md), for real: a root agent with ``--private-network on`` and an edge
proxy on the same host taking the machines' Flycast connections (``--flycast``). From inside a
machine of the app, a connection to ``<app>.flycast`` starts the app's stopped machine
(``autostart``) and reaches it; a machine of another organization finds no such name, and its
connection to the address gets no answer and starts nothing; nobody reaches the proxy's
Flycast port itself. The name is the address the worker routes even while the worker's names
have not heard of the app's record (its organisation) yet: the machines' records name their
network."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from souq.errors import MachineNotStarted
from souq.model.machine import Machine, MachineState
from souq.natsserver import free_port
from souq.network.addresses import PROXY_ADDRESS, flycast_ip, network_of
from souq.testing import Cluster, ProxyProcess, wait_until
from tests.isolated import PRIVATE_NETWORK, PYTHON, private_network_fixtures

_SERVE = (
    "import os,socket\n"
    "s=socket.socket(socket.AF_INET6);s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind(('::',int(os.environ['PORT'])));s.listen()\n"
    "print('listening',flush=True)\n"
    "while True:\n"
    "  c,_=s.accept();c.recv(4096)\n"
    "  b=os.environ['SOUQ_MACHINE_ID'].encode()\n"
    "  c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nConnection: close\\r\\n\\r\\n%s'"
    "%(len(b),b));c.close()\n"
)
# argv: a name or an address, a port. Prints what the name is, then what came back.
_CONNECT = (
    "import socket,sys\n"
    "try:\n"
    "  found=socket.getaddrinfo(sys.argv[1],int(sys.argv[2]),socket.AF_INET6,socket.SOCK_STREAM)\n"
    "except OSError as e:\n"
    "  print('NONAME');sys.exit()\n"
    "where=found[0][4][:2]\n"
    "try:\n"
    "  s=socket.create_connection(where,timeout=float(sys.argv[3]))\n"
    "  s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n');data=b''\n"
    "  while chunk:=s.recv(4096): data+=chunk\n"
    "  print('OK',where[0],data.split(b'\\r\\n\\r\\n')[-1].decode())\n"
    "except OSError as e:\n"
    "  print('FAIL',where[0],type(e).__name__)\n"
)

pytestmark = PRIVATE_NETWORK

APPS_STREAM = "KV_souq-apps"  # the apps' records (souq.broker.app_store), as JetStream holds them

FLYCAST_PORT = free_port()  # this run's own, beside other runs' agents and proxies


root, cluster = private_network_fixtures("souq-flycast-", FLYCAST_PORT)


@pytest.fixture(scope="module")
def proxy(cluster: Cluster, root: Path) -> Iterator[ProxyProcess]:
    with ProxyProcess(
        nats_url=cluster.nats.url,
        log_path=root / "proxy.log",
        extra_args=["--flycast", f"[{PROXY_ADDRESS}]:{FLYCAST_PORT}"],
    ) as p:
        yield p


def _app(cluster: Cluster, org: str) -> str:
    name = "fc" + uuid.uuid4().hex[:10]
    with cluster.client() as client:
        client.create_app(name, org_slug=org)
    return name


def _machine(cluster: Cluster, app: str, config: dict[str, object]) -> Machine:
    with cluster.client() as client:
        m = client.create_machine(app, "mad", {"guest": {"memory_mb": 64}, **config})
        m = client.wait(app, m.id, MachineState.STARTED, timeout=60)

        def ran() -> bool:
            try:
                return client.exec(app, m.id, ["true"], stdin=None, timeout_s=10).exit_code == 0
            except MachineNotStarted:
                return False

        wait_until(ran, timeout=30, interval=0.05, message="the machine to run a command")
    return m


def _server(cluster: Cluster, app: str) -> Machine:
    """A machine of ``app`` serving HTTP on 8080 (edge port 80, autostart), stopped."""
    m = _machine(
        cluster,
        app,
        {
            "cmd": [PYTHON, "-c", _SERVE],
            "services": [
                {
                    "internal_port": 8080,
                    "autostart": True,
                    "ports": [{"port": 80, "handlers": ["http"]}],
                }
            ],
        },
    )
    _stop(cluster, app, m)
    return m


def _stop(cluster: Cluster, app: str, m: Machine) -> None:
    with cluster.client() as client:
        client.stop(app, m.id)
        client.wait(app, m.id, MachineState.STOPPED, timeout=60)


def _hold_back_app_records(cluster: Cluster) -> None:
    """The worker's names hear of no app record for a while: the consumer of their watch of
    the apps' bucket is deleted on the server (nats-py's ordered consumer notices after two
    missed heartbeats, 10 s, and makes another)."""

    async def delete() -> None:
        bus = await nats.connect(cluster.nats.url, **cluster.nats_options())
        try:
            js = bus.jetstream()
            deadline = time.monotonic() + 30
            while not (consumers := await js.consumers_info(APPS_STREAM)):
                assert time.monotonic() < deadline, "no watch of the apps' records"
                await asyncio.sleep(0.05)
            for consumer in consumers:
                await js.delete_consumer(APPS_STREAM, consumer.name)
        finally:
            await bus.close()

    asyncio.run(delete())


def _state(cluster: Cluster, app: str, m: Machine) -> MachineState:
    with cluster.client() as client:
        return client.get_machine(app, m.id).state


def _connect(
    cluster: Cluster, app: str, m: Machine, target: str, port: int, timeout_s: float = 20
) -> str:
    with cluster.client() as client:
        reply = client.exec(
            app,
            m.id,
            [PYTHON, "-c", _CONNECT, target, str(port), str(timeout_s)],
            stdin=None,
            timeout_s=60,
        )
    return reply.stdout.strip()


def test_a_connection_by_name_starts_the_apps_stopped_machine(
    cluster: Cluster, proxy: ProxyProcess
) -> None:
    app = _app(cluster, "acme")
    server = _server(cluster, app)
    talker = _machine(cluster, app, {"cmd": ["sleep", "600"]})
    try:
        assert _state(cluster, app, server) is MachineState.STOPPED
        address = flycast_ip(network_of("acme"), app)
        # The edge port and the internal port both reach the service; the machine is started
        # by the first connection, which waits for it and gets its answer.
        got = _connect(cluster, app, talker, f"{app}.flycast", 80)
        assert got == f"OK {address} {server.id}", got
        assert _state(cluster, app, server) is MachineState.STARTED
        assert _connect(cluster, app, talker, address, 8080) == f"OK {address} {server.id}"
    finally:
        with cluster.client() as client:
            for m in (server, talker):
                client.destroy(app, m.id, force=True)


def _with_a_stranger(cluster: Cluster) -> tuple[str, str, Machine, Machine, Machine]:
    """An app of acme with its (stopped) server and a machine to talk from, and another
    organisation's app with a machine of its own."""
    app, stranger_app = _app(cluster, "acme"), _app(cluster, "other")
    server = _server(cluster, app)
    talker = _machine(cluster, app, {"cmd": ["sleep", "600"]})
    stranger = _machine(cluster, stranger_app, {"cmd": ["sleep", "600"]})
    return app, stranger_app, server, talker, stranger


def test_another_network_cannot_wake_it_nor_reach_the_proxy_port(
    cluster: Cluster, proxy: ProxyProcess
) -> None:
    app, stranger_app, server, talker, stranger = _with_a_stranger(cluster)
    address = flycast_ip(network_of("acme"), app)
    try:
        # Another organization's machine: no such name, and no answer at the address.
        assert _connect(cluster, stranger_app, stranger, f"{app}.flycast", 80) == "NONAME"
        got = _connect(cluster, stranger_app, stranger, address, 80, timeout_s=2)
        assert got == f"FAIL {address} TimeoutError"
        # The proxy's own port is the workers' to send to, not the machines' to call.
        got = _connect(cluster, app, talker, PROXY_ADDRESS, FLYCAST_PORT, timeout_s=2)
        assert got == f"FAIL {PROXY_ADDRESS} TimeoutError"
        assert _state(cluster, app, server) is MachineState.STOPPED
        # A port no service of the app has: the proxy closes the connection, starts nothing.
        got = _connect(cluster, app, talker, address, 9999, timeout_s=5)
        assert got in (f"OK {address}", f"FAIL {address} ConnectionResetError"), got
        assert _state(cluster, app, server) is MachineState.STOPPED
    finally:
        with cluster.client() as client:
            for a, m in ((app, server), (app, talker), (stranger_app, stranger)):
                client.destroy(a, m.id, force=True)


def test_the_name_is_the_address_the_worker_routes_while_the_apps_records_are_late(
    cluster: Cluster, proxy: ProxyProcess
) -> None:
    _app(cluster, "acme")  # the apps' bucket, and the names' watch of it
    _hold_back_app_records(cluster)
    app, stranger_app, server, talker, stranger = _with_a_stranger(cluster)
    address = flycast_ip(network_of("acme"), app)
    try:
        # The names take both apps for the default organisation's; the machines' records
        # say which network each is on, and the name follows them.
        got = _connect(cluster, app, talker, f"{app}.flycast", 80)
        assert got == f"OK {address} {server.id}", got
        assert _connect(cluster, stranger_app, stranger, f"{app}.flycast", 80) == "NONAME"
    finally:
        with cluster.client() as client:
            for a, m in ((app, server), (app, talker), (stranger_app, stranger)):
                client.destroy(a, m.id, force=True)
