"""The edge proxy reaches machines of other hosts (docs/network.md, "Edge ports"), for real: two
hosts as network namespaces (souq.multihost), root agents with ``--private-network on`` and
their host's address as ``--advertise``, and one ``souq proxy`` on the first host (``mad``,
with ``--flycast``). A machine on the other host (``syd``) answers through the proxy whether it
listens on ``0.0.0.0`` or ``::``; a stopped one is started by a request, and by a Flycast
connection from a machine on ``mad``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from souq.client.api import SouqClient
from souq.errors import MachineNotStarted
from souq.model.machine import Machine, MachineState
from souq.multihost import Host, Hosts
from souq.netns import missing
from souq.network.addresses import FLYCAST_PORT, PROXY_ADDRESS, flycast_ip, network_of
from souq.testing import ProxyProcess, wait_until
from tests.isolated import PRIVATE_NETWORK, PYTHON, machines_root

_SERVE = (
    "import os,socket\n"
    "fam=socket.AF_INET6 if ':' in os.environ['BIND'] else socket.AF_INET\n"
    "s=socket.socket(fam);s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind((os.environ['BIND'],int(os.environ['PORT'])));s.listen()\n"
    "print('listening',flush=True)\n"
    "while True:\n"
    "  c,_=s.accept();c.recv(4096)\n"
    "  b=os.environ['SOUQ_MACHINE_ID'].encode()\n"
    "  c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nConnection: close\\r\\n\\r\\n%s'"
    "%(len(b),b));c.close()\n"
)
_GET = (
    "import socket,sys\n"
    "try:\n"
    "  s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=30)\n"
    "  s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n');data=b''\n"
    "  while chunk:=s.recv(4096): data+=chunk\n"
    "  print('OK',data.split(b'\\r\\n\\r\\n')[-1].decode())\n"
    "except OSError as e:\n"
    "  print('FAIL',type(e).__name__)\n"
)

pytestmark = [
    pytest.mark.skipif(missing() is not None, reason=f"hosts as namespaces: {missing()}"),
    *PRIVATE_NETWORK[1:],  # the root check is missing()'s
]


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with (
        machines_root("souq-edge-") as root,
        Hosts(root / "hosts", ["mad", "syd"], heartbeat_interval_s=0.5, private_network=True) as h,
    ):
        yield h


@pytest.fixture(scope="module")
def proxy(hosts: Hosts) -> Iterator[ProxyProcess]:
    mad = hosts.in_region("mad")[0]
    with ProxyProcess(
        nats_url=mad.agent.nats_url,
        log_path=hosts.root / "proxy.log",
        netns=mad.name,
        host=mad.net.address,
        port=4281,
        extra_args=["--flycast", f"[{PROXY_ADDRESS}]:{FLYCAST_PORT}"],
    ) as p:
        yield p


def _client(hosts: Hosts) -> SouqClient:
    return SouqClient(hosts.api_url, token=hosts.auth.admin() if hosts.auth else None)


def _app(hosts: Hosts) -> str:
    name = "eg" + uuid.uuid4().hex[:10]
    with _client(hosts) as client:
        client.create_app(name, org_slug="acme")
    return name


def _machine(hosts: Hosts, app: str, region: str, config: dict[str, Any]) -> Machine:
    with _client(hosts) as client:
        m = client.create_machine(app, region, {"guest": {"memory_mb": 64}, **config})
        return client.wait(app, m.id, MachineState.STARTED, timeout=60)


def _server(hosts: Hosts, app: str, bind: str) -> Machine:
    service = {"internal_port": 8080, "ports": [{"port": 80, "handlers": ["http"]}]}
    config = {"cmd": [PYTHON, "-c", _SERVE], "env": {"BIND": bind}, "services": [service]}
    m = _machine(hosts, app, "syd", config)
    with _client(hosts) as client:
        wait_until(lambda: "listening" in client.logs(app, m.id), timeout=30, message="listening")
    return m


def _host_of(hosts: Hosts, m: Machine) -> Host:
    (host,) = (h for h in hosts.hosts if h.worker_id == m.worker_id)
    return host


def _through_proxy(proxy: ProxyProcess, app: str, timeout: float = 30) -> httpx.Response:
    return httpx.get(proxy.url + "/", headers={"Host": f"{app}.localhost"}, timeout=timeout)


def _stop(hosts: Hosts, app: str, m: Machine) -> None:
    with _client(hosts) as client:
        client.stop(app, m.id)
        client.wait(app, m.id, MachineState.STOPPED, timeout=60)


def _state(hosts: Hosts, app: str, m: Machine) -> MachineState:
    with _client(hosts) as client:
        return client.get_machine(app, m.id).state


def test_the_proxy_reaches_a_machine_of_another_host_on_0000_and_on_ipv6_any(
    hosts: Hosts, proxy: ProxyProcess
) -> None:
    for bind in ("0.0.0.0", "::"):
        app = _app(hosts)
        m = _server(hosts, app, bind)
        try:
            assert _host_of(hosts, m).region == "syd"
            assert m.address is not None and m.address.edge_host == _host_of(hosts, m).net.address
            assert m.address.edge_ports.keys() == {8080}

            def answered(app: str = app) -> str | None:
                r = _through_proxy(proxy, app, timeout=5)
                return r.text if r.status_code == 200 else None

            assert wait_until(answered, timeout=20, message=f"the proxy to reach {bind}") == m.id
        finally:
            with _client(hosts) as client:
                client.destroy(app, m.id, force=True)


def test_a_stopped_machine_of_another_host_is_woken_by_a_request_and_by_flycast(
    hosts: Hosts, proxy: ProxyProcess
) -> None:
    app = _app(hosts)
    server = _server(hosts, app, "0.0.0.0")
    talker = _machine(hosts, app, "mad", {"cmd": ["sleep", "600"]})
    try:
        wait_until(
            lambda: _through_proxy(proxy, app, timeout=5).status_code == 200,
            timeout=20,
            message="the proxy to know the machine",
        )
        _stop(hosts, app, server)
        r = _through_proxy(proxy, app)
        assert (r.status_code, r.text) == (200, server.id)
        assert _state(hosts, app, server) is MachineState.STARTED

        # From a machine on mad, by its app's Flycast address: the proxy of mad's host takes
        # it, starts the machine on syd, and pipes the bytes there.
        _stop(hosts, app, server)

        def ran() -> bool:
            with _client(hosts) as client:
                try:
                    reply = client.exec(app, talker.id, ["true"], stdin=None, timeout_s=10)
                except MachineNotStarted:
                    return False
            return reply.exit_code == 0

        wait_until(ran, timeout=30, interval=0.05, message="the talker to run a command")
        address = flycast_ip(network_of("acme"), app)
        with _client(hosts) as client:
            reply = client.exec(
                app, talker.id, [PYTHON, "-c", _GET, address, "80"], stdin=None, timeout_s=60
            )
        assert reply.stdout.strip() == f"OK {server.id}", reply
        assert _state(hosts, app, server) is MachineState.STARTED
    finally:
        with _client(hosts) as client:
            for m in (server, talker):
                client.destroy(app, m.id, force=True)
