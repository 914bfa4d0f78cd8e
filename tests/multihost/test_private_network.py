"""The private network across hosts (docs/network.md), for real: two hosts as network
namespaces (souq.multihost), each with its NATS node and a root agent with ``--private-network
on`` and its host's address as ``--underlay``; sandboxed machines. A machine on one host opens
a TCP connection to a machine on the other by its app's ``.internal`` name and they exchange
bytes; a machine of an app with a network of its own finds no such name, and its packets to
the other machine's address get no answer; the routes follow what the heartbeats say."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from souq.client.api import SouqClient
from souq.errors import MachineNotStarted
from souq.model.machine import Machine, MachineState
from souq.multihost import Host, Hosts
from souq.netns import NetHost, missing
from souq.network import links, wireguard
from souq.network.mesh import worker_prefix
from souq.testing import wait_until
from tests.isolated import PRIVATE_NETWORK, PYTHON, machines_root

_ECHO = (
    "import socket\n"
    "s=socket.socket(socket.AF_INET6);s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind(('::',7000));s.listen()\n"
    "print('listening',flush=True)\n"
    "while True:\n"
    "  c,_=s.accept();data=b''\n"
    "  while chunk:=c.recv(65536): data+=chunk\n"
    "  c.sendall(b'echo:'+data);c.close()\n"
)
_TALK = (
    "import socket,sys\n"
    "try:\n"
    "  found=socket.getaddrinfo(sys.argv[1],7000,socket.AF_INET6,socket.SOCK_STREAM)\n"
    "except OSError as e:\n"
    "  print('NONAME',e);sys.exit()\n"
    "try:\n"
    "  s=socket.create_connection(found[0][4][:2],timeout=3);s.sendall(sys.argv[2].encode())\n"
    "  s.shutdown(socket.SHUT_WR);data=b''\n"
    "  while chunk:=s.recv(65536): data+=chunk\n"
    "  print('OK',found[0][4][0],data.decode())\n"
    "except OSError as e:\n"
    "  print('FAIL',type(e).__name__)\n"
)

pytestmark = [
    pytest.mark.skipif(missing() is not None, reason=f"hosts as namespaces: {missing()}"),
    *PRIVATE_NETWORK[1:],  # the root check is missing()'s
]


UNDERLAYS: dict[str, tuple[Callable[[NetHost], str], str, str]] = {
    "straight": (lambda net: net.address6, "none", ""),  # IPv6 on the hosts' segment
    "vxlan": (lambda net: net.address, "none", "vxlan"),  # IPv4, --underlay-link vxlan
    # IPv4 on the hosts' segment, the default (auto): IPv6 via link-locals once probed
    "auto": (lambda net: net.address, "none", ""),
    # ... and both saying --underlay-link direct: the same, without a probe
    "link": (lambda net: net.address, "none", "direct"),
    "wireguard": (lambda net: net.address, "wireguard", ""),  # encrypted
}


@pytest.fixture(scope="module", params=sorted(UNDERLAYS))
def hosts(request: pytest.FixtureRequest) -> Iterator[Hosts]:
    underlay, encryption, link = UNDERLAYS[request.param]
    if encryption == "wireguard" and wireguard.unavailable() is not None:
        pytest.skip(f"WireGuard: {wireguard.unavailable()}")
    with (
        machines_root("souq-xhost-") as root,
        Hosts(
            root / "hosts",
            ["mad", "syd"],
            heartbeat_interval_s=0.5,
            private_network=True,
            underlay=underlay,
            underlay_encryption=encryption,
            underlay_link=link,
        ) as built,
    ):
        yield built


def _client(hosts: Hosts) -> SouqClient:
    return SouqClient(hosts.api_url, token=hosts.auth.admin() if hosts.auth else None)


def _app(hosts: Hosts, **fields: str) -> str:
    name = "xh" + uuid.uuid4().hex[:10]
    with _client(hosts) as client:
        client.create_app(name, **fields)
    return name


def _machine(hosts: Hosts, app: str, region: str, cmd: list[str]) -> Machine:
    config = {"guest": {"memory_mb": 64}, "cmd": cmd}
    with _client(hosts) as client:
        m = client.create_machine(app, region, config)
        return client.wait(app, m.id, MachineState.STARTED, timeout=60)


def _echo(hosts: Hosts, app: str, region: str) -> Machine:
    m = _machine(hosts, app, region, [PYTHON, "-c", _ECHO])
    with _client(hosts) as client:
        wait_until(
            lambda: "listening" in client.logs(app, m.id), timeout=30, message="the echo to listen"
        )
    return m


def _ready(hosts: Hosts, app: str, m: Machine) -> None:
    """Until the machine runs a command (a start is reported as bwrap begins its set-up)."""

    def ran() -> bool:
        with _client(hosts) as client:
            try:
                return client.exec(app, m.id, ["true"], stdin=None, timeout_s=10).exit_code == 0
            except MachineNotStarted:
                return False

    wait_until(ran, timeout=30, interval=0.05, message="the machine to run a command")


def _talk(hosts: Hosts, app: str, m: Machine, target: str, payload: str) -> str:
    with _client(hosts) as client:
        reply = client.exec(
            app, m.id, [PYTHON, "-c", _TALK, target, payload], stdin=None, timeout_s=30
        )
    return reply.stdout.strip()


def _tag(host: Host) -> str:
    return links.WorkerNetwork(host.worker_id, Path("/nonexistent")).tag


def _fast_packets(host: Host) -> int:
    """Packets the host's fast path sent on to other workers (souq.network.fastpath)."""
    chain = ("netdev", f"souq-{_tag(host)}", "peers")
    shown = host.net.exec("nft", "list", "chain", *chain, check=False)
    return sum(int(n) for n in re.findall(r"counter packets (\d+)", shown))


def _host_of(hosts: Hosts, m: Machine) -> Host:
    (host,) = (h for h in hosts.hosts if h.worker_id == m.worker_id)
    return host


def test_a_machine_reaches_one_on_another_host_by_name_and_others_cannot(hosts: Hosts) -> None:
    server_app, client_app = _app(hosts, org_slug="acme"), _app(hosts, org_slug="acme")
    stranger_app = _app(hosts, org_slug="acme", network="own-" + uuid.uuid4().hex[:6])
    server = _echo(hosts, server_app, "syd")
    talker = _machine(hosts, client_app, "mad", ["sleep", "600"])
    stranger = _machine(hosts, stranger_app, "mad", ["sleep", "600"])
    _ready(hosts, client_app, talker)
    _ready(hosts, stranger_app, stranger)
    mad, syd = _host_of(hosts, talker), _host_of(hosts, server)
    assert mad is not syd and _host_of(hosts, stranger) is mad
    assert server.private_ip is not None

    # Each host routes the other's /48 as the heartbeats said: to its IPv6 address on the
    # hosts' segment (or, over IPv4, by default once probed or with --underlay-link direct,
    # its link-local address there), or into the VXLAN or WireGuard device.
    args = list(mad.agent.extra_args)
    link = args[args.index("--underlay-link") + 1] if "--underlay-link" in args else "auto"
    ipv4 = ":" not in args[args.index("--underlay") + 1]
    over_link = ipv4 and link != "vxlan" and "wireguard" not in args

    def routed(host: Host, other: Host) -> bool:
        shown = host.net.exec("ip", "-6", "route", "show", str(worker_prefix(other.worker_id)))
        if over_link:
            local = other.net.exec("ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link")
            return f"via {local.split()[3].split('/')[0]} dev eth0" in shown
        return (f"via {other.net.address6} dev eth0" in shown) or ("dev sx" in shown)

    wait_until(lambda: routed(mad, syd) and routed(syd, mad), timeout=20, message="the routes")

    # By name, from mad to syd: the bytes come back.
    def talked() -> str | None:
        got = _talk(hosts, client_app, talker, f"{server_app}.internal", "hello across")
        return got if got.startswith("OK") else None

    before = _fast_packets(mad)
    got = wait_until(talked, timeout=30, message=f"{server_app}.internal to answer from mad")
    assert got == f"OK {server.private_ip} echo:hello across"
    payload = "x" * 20_000  # more than one packet, beyond the VXLAN device's MTU
    assert _talk(hosts, client_app, talker, server.private_ip, payload).endswith(payload)
    # Routed straight or over VXLAN, past the hosts' IP stacks (over WireGuard: none).
    fast = _fast_packets(mad) - before
    encrypted = f"sx{_tag(mad)}wg" in mad.net.exec("ip", "link")
    assert (fast == 0) if encrypted else fast > 0

    # Another network, on the same host as the talker: no such name (once the names have
    # the apps' records: until then both apps count as the default organization's), and no
    # answer at the address (dropped by the worker's filter, whatever the names know).
    wait_until(
        lambda: _talk(hosts, stranger_app, stranger, f"{server_app}.internal", "x").startswith(
            "NONAME"
        ),
        timeout=20,
        message="the name to be out of the stranger's reach",
    )
    before = _fast_packets(mad)
    assert _talk(hosts, stranger_app, stranger, server.private_ip, "x") == "FAIL TimeoutError"
    assert _fast_packets(mad) == before  # none of the stranger's went the fast way
    # And the talker still can: the stranger's drop is its own.
    assert _talk(hosts, client_app, talker, server.private_ip, "again").endswith("echo:again")
    with _client(hosts) as client:
        for app, m in ((server_app, server), (client_app, talker), (stranger_app, stranger)):
            client.destroy(app, m.id, force=True)


def test_the_receiving_host_drops_what_comes_from_another_network(hosts: Hosts) -> None:
    """Even a packet that got past its own worker (sent from the host itself, as a forged
    VXLAN frame would arrive) reaches a machine only from an address of its own network."""
    server_app = _app(hosts, org_slug="acme")
    server = _echo(hosts, server_app, "syd")
    mad, syd = hosts.in_region("mad")[0], _host_of(hosts, server)
    try:
        assert server.private_ip is not None
        rules = syd.net.exec("ip6tables", "-S")
        tag = _tag(syd)
        (accept,) = (r for r in rules.splitlines() if f"-d {server.private_ip}/128" in r)
        assert accept.startswith(f"-A SOUQ-{tag}-TO -s fdaa:0:0:") and f"-o sx{tag}m" in accept
        # From the mad host itself (its address is no machine's of any network): no answer.
        done = mad.net.exec(PYTHON, "-c", _TALK, server.private_ip, "x", check=False)
        assert done.strip() == "FAIL TimeoutError"
    finally:
        with _client(hosts) as client:
            client.destroy(server_app, server.id, force=True)


def test_traffic_between_hosts_outlives_an_agent_killed_and_started_again(hosts: Hosts) -> None:
    """The routes are the kernel's: with the server's agent killed (-9) the talker still
    reaches it, and once the agent is back (its routes rebuilt from the heartbeats) too."""
    server_app, client_app = _app(hosts, org_slug="acme"), _app(hosts, org_slug="acme")
    server = _echo(hosts, server_app, "syd")
    talker = _machine(hosts, client_app, "mad", ["sleep", "600"])
    _ready(hosts, client_app, talker)
    syd = _host_of(hosts, server)
    assert server.private_ip is not None

    def reached(payload: str) -> bool:
        got = _talk(hosts, client_app, talker, server.private_ip or "", payload)
        return got.endswith(f"echo:{payload}")

    try:
        wait_until(lambda: reached("before"), timeout=30, message="the server to answer")
        syd.agent.kill()
        assert reached("while its agent is away")
        # The route back lost meanwhile: the new agent makes it again from mad's heartbeats.
        back = str(worker_prefix(talker.worker_id))
        syd.net.exec("ip", "-6", "route", "del", back)
        syd.agent.start()
        hosts.wait_workers_up([syd])
        wait_until(
            lambda: syd.net.exec("ip", "-6", "route", "show", back).strip(),
            timeout=20,
            message="syd's agent to route to mad again",
        )
        assert reached("after")
    finally:
        with _client(hosts) as client:
            client.destroy(server_app, server.id, force=True)
            client.destroy(client_app, talker.id, force=True)
