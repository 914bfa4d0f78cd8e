"""The private network on one worker (docs/network.md), with a real root agent started with
``--private-network on``, real sandboxes, ip6tables and a real edge proxy: machines of one app
reach each other's private_ip, a machine of another organization and the worker's own ports
are out of reach, the address survives a restart and a kill -9 of the agent, the proxy reaches
a machine listening on 0.0.0.0, one on :: and one on 127.0.0.1 (what PORT says), and a destroy
leaves no namespace or link."""

from __future__ import annotations

import ipaddress
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from souq.model.machine import Machine, MachineState
from souq.network import links
from souq.network.addresses import CLUSTER_PREFIX, network_bits, network_of
from souq.testing import Cluster, ProxyProcess, wait_until
from tests.isolated import PRIVATE_NETWORK, PYTHON, private_network_fixtures

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
_CONNECT = (
    "import socket,sys\n"
    "try:\n"
    "  s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=2)\n"
    "  s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
    "  print('OK',s.recv(4096).split(b'\\r\\n\\r\\n')[-1].decode())\n"
    "except OSError as e:\n"
    "  print('FAIL',type(e).__name__)\n"
)

pytestmark = PRIVATE_NETWORK


root, cluster = private_network_fixtures("souq-pnet-")


@pytest.fixture(scope="module")
def proxy(cluster: Cluster, root: Path) -> Iterator[ProxyProcess]:
    with ProxyProcess(nats_url=cluster.nats.url, log_path=root / "proxy.log") as p:
        yield p


def _app(cluster: Cluster, org: str = "", network: str = "") -> str:
    name = "pn" + uuid.uuid4().hex[:10]
    with cluster.client() as client:
        client.create_app(name, org_slug=org, network=network)
    return name


def _server(cluster: Cluster, app: str, bind: str = "::", port: int = 8080) -> Machine:
    config = {
        "guest": {"memory_mb": 64},
        "cmd": [PYTHON, "-c", _SERVE],
        "env": {"BIND": bind},
        "services": [{"internal_port": port, "ports": [{"port": 80, "handlers": ["http"]}]}],
    }
    with cluster.client() as client:
        m = client.create_machine(app, "mad", config)
        m = client.wait(app, m.id, MachineState.STARTED, timeout=60)

        def listening() -> bool:
            return "listening" in client.logs(app, m.id)

        wait_until(listening, timeout=30, message="the machine to listen")
    return m


def _connect(cluster: Cluster, app: str, m: Machine, host: str, port: int) -> str:
    with cluster.client() as client:
        reply = client.exec(
            app, m.id, [PYTHON, "-c", _CONNECT, host, str(port)], stdin=None, timeout_s=30
        )
    return reply.stdout.strip()


def _destroy(cluster: Cluster, app: str, *machines: Machine) -> None:
    with cluster.client() as client:
        for m in machines:
            client.destroy(app, m.id, force=True)


def _netns_of(cluster: Cluster) -> list[str]:
    tag = links.WorkerNetwork(cluster.agents[0].worker_id or "", Path("/nonexistent")).tag
    return sorted(n for n in os.listdir(links.NETNS_DIR) if n.startswith(f"souq-{tag}-"))


def _links_of(cluster: Cluster) -> list[str]:
    tag = links.WorkerNetwork(cluster.agents[0].worker_id or "", Path("/nonexistent")).tag
    return sorted(n for n in os.listdir("/sys/class/net") if n.startswith(f"sx{tag}m"))


def test_machines_of_one_app_reach_each_other_and_others_cannot(cluster: Cluster) -> None:
    app, stranger = _app(cluster, "acme"), _app(cluster, "other")
    a, b = _server(cluster, app), _server(cluster, app)
    c = _server(cluster, stranger)
    try:
        assert a.private_ip and a.private_ip != b.private_ip
        assert a.address is not None and a.address.network == network_of("acme")
        value = int(ipaddress.IPv6Address(a.private_ip))
        assert ipaddress.IPv6Address(a.private_ip) in CLUSTER_PREFIX
        assert value >> 48 & 0xFFFFFFFF == network_bits(network_of("acme"))
        assert _connect(cluster, app, a, b.private_ip, 8080) == f"OK {b.id}"
        assert _connect(cluster, app, b, a.private_ip, 8080) == f"OK {a.id}"
        # Another organization's machine: nothing comes back (dropped), within the timeout.
        assert _connect(cluster, stranger, c, a.private_ip, 8080).startswith("FAIL")
        assert _connect(cluster, app, a, c.private_ip, 8080).startswith("FAIL")
        # Its own address works for it too (loopback of its own namespace).
        assert _connect(cluster, app, a, a.private_ip, 8080) == f"OK {a.id}"
    finally:
        _destroy(cluster, app, a, b)
        _destroy(cluster, stranger, c)


def test_a_network_named_alike_in_another_organization_is_another_network(
    cluster: Cluster,
) -> None:
    """Fly's ``network`` on app create is the organization's: a rival organization that names
    its app's network as another's does gets a network of its own, and no way in."""
    name = "db" + uuid.uuid4().hex[:6]
    app, rival = _app(cluster, "acme", network=name), _app(cluster, "rival", network=name)
    a, r = _server(cluster, app), _server(cluster, rival)
    try:
        assert a.address is not None and r.address is not None
        assert a.address.network != r.address.network
        assert _connect(cluster, rival, r, a.private_ip or "", 8080).startswith("FAIL")
        assert _connect(cluster, app, a, r.private_ip or "", 8080).startswith("FAIL")
    finally:
        _destroy(cluster, app, a)
        _destroy(cluster, rival, r)


_RESOLVE = (
    "import socket,sys\n"
    "try:\n"
    "  found=socket.getaddrinfo(sys.argv[1],8080,socket.AF_INET6,socket.SOCK_STREAM)\n"
    "  print(' '.join(sorted({a[4][0] for a in found})))\n"
    "except OSError as e:\n"
    "  print('FAIL',e)\n"
)


def test_a_machine_finds_its_apps_machines_by_name(cluster: Cluster) -> None:
    """From inside a machine, through its own resolv.conf: the worker's DNS (started with the
    private network, at fdaa::3) answers ``<app>.internal`` and ``<id>.vm.<app>.internal``
    with the private addresses; a name that is no app's is not found."""
    app = _app(cluster, "acme")
    a, b = _server(cluster, app), _server(cluster, app)
    try:
        with cluster.client() as client:

            def resolved(name: str) -> str:
                reply = client.exec(
                    app, a.id, [PYTHON, "-c", _RESOLVE, name], stdin=None, timeout_s=30
                )
                return reply.stdout.strip()

            both = " ".join(sorted({a.private_ip, b.private_ip}))
            wait_until(
                lambda: resolved(f"{app}.internal") == both,
                timeout=30,
                message=f"{app}.internal to answer both machines",
            )
            assert resolved(f"{b.id}.vm.{app}.internal") == b.private_ip
            assert resolved(f"nosuchapp{uuid.uuid4().hex[:6]}.internal").startswith("FAIL")
    finally:
        _destroy(cluster, app, a, b)


def test_a_machine_cannot_reach_the_workers_ports(cluster: Cluster) -> None:
    app = _app(cluster)
    a = _server(cluster, app)
    nats_port = int(cluster.nats.url.rsplit(":", 1)[1])
    host_ips = [
        ip
        for ip in os.popen("ip -o -4 addr show scope global").read().split()
        if ip.count(".") == 3 and "/" in ip
    ]
    try:
        assert _connect(cluster, app, a, "127.0.0.1", nats_port).startswith("FAIL")
        for cidr in host_ips:
            assert _connect(cluster, app, a, cidr.split("/")[0], nats_port).startswith("FAIL")
        assert _connect(cluster, app, a, "169.254.0.1", nats_port).startswith("FAIL")
        assert _connect(cluster, app, a, "fe80::1%eth0", nats_port).startswith("FAIL")
        with cluster.client() as client:
            reply = client.exec(app, a.id, ["cat", "/etc/resolv.conf"], stdin=None, timeout_s=30)
        assert "nameserver fdaa::3" in reply.stdout
    finally:
        _destroy(cluster, app, a)


def test_the_address_survives_a_restart_and_an_agent_kill(cluster: Cluster) -> None:
    app = _app(cluster)
    a, b = _server(cluster, app), _server(cluster, app)
    try:
        with cluster.client() as client:
            client.restart(app, a.id)
            again = client.wait(app, a.id, MachineState.STARTED, timeout=60)
        assert again.private_ip == a.private_ip
        agent = cluster.agents[0]
        agent.kill()
        agent.start()
        cluster.wait_for_workers()
        with cluster.client() as client:
            after = client.get_machine(app, a.id)
            assert after.private_ip == a.private_ip and after.state is MachineState.STARTED
            shown = client.list_machines(app)
        assert sorted(m.private_ip for m in shown) == sorted([a.private_ip, b.private_ip])

        def reached() -> str | None:
            got = _connect(cluster, app, b, a.private_ip, 8080)
            return got if got.startswith("OK") else None

        assert wait_until(reached, timeout=20, message="a to answer b again") == f"OK {a.id}"
        c = _server(cluster, app)  # a new machine after the restart: an address of its own
        assert c.private_ip not in (a.private_ip, b.private_ip)
        _destroy(cluster, app, c)
    finally:
        _destroy(cluster, app, a, b)


def test_the_proxy_reaches_machines_on_0000_on_ipv6_any_and_on_loopback(
    cluster: Cluster, proxy: ProxyProcess
) -> None:
    for bind in ("0.0.0.0", "::", "127.0.0.1"):
        app = _app(cluster)
        m = _server(cluster, app, bind=bind)
        try:
            url = proxy.url + "/"

            def answered(url: str = url, app: str = app) -> str | None:
                r = httpx.get(url, headers={"Host": f"{app}.localhost"}, timeout=5)
                return r.text if r.status_code == 200 else None

            assert wait_until(answered, timeout=20, message=f"the proxy to reach {bind}") == m.id
        finally:
            _destroy(cluster, app, m)


def test_a_destroy_leaves_no_namespace_or_link(cluster: Cluster) -> None:
    app = _app(cluster)
    before_ns, before_links = _netns_of(cluster), _links_of(cluster)
    m = _server(cluster, app)
    assert len(_netns_of(cluster)) == len(before_ns) + 1
    _destroy(cluster, app, m)

    def gone() -> bool:
        return _netns_of(cluster) == before_ns and _links_of(cluster) == before_links

    wait_until(gone, timeout=20, message="the machine's namespace and link to go")


def test_the_agents_start_sweeps_what_a_gone_machine_left(cluster: Cluster) -> None:
    worker = cluster.agents[0].worker_id or ""
    tag = links.WorkerNetwork(worker, Path("/nonexistent")).tag
    stale = f"souq-{tag}-0000deadbeef00"  # as if its machine were destroyed while no agent ran
    app = _app(cluster)
    kept = _server(cluster, app)
    try:
        agent = cluster.agents[0]
        agent.kill()
        os.system(f"ip netns add {stale}")
        assert stale in _netns_of(cluster)
        agent.start()
        cluster.wait_for_workers()
        assert stale not in _netns_of(cluster)
        assert any(kept.id in name for name in _netns_of(cluster))  # a live machine's stays
        assert _connect(cluster, app, kept, kept.private_ip, 8080) == f"OK {kept.id}"
    finally:
        os.system(f"ip netns delete {stale} 2>/dev/null")
        _destroy(cluster, app, kept)
