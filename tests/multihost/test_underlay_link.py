"""The default ``--underlay-link auto`` across two IPv4 hosts of one segment, for real (two
hosts as network namespaces on one bridge, souq.multihost; agents with no ``--underlay-link``,
their IPv4 addresses as ``--underlay``; sandboxed machines): each worker probes the other's
path over the link and, answered, routes the other's /48 straight via its link-local address
on the underlay device, not into the VXLAN device; machines reach each other by name. When
the segment stops carrying the workers' fdaa traffic (an nftables rule on the bridge drops
IPv6 from fdaa::/16, neighbour discovery untouched, so the link-locals still answer), the
probes go unanswered and both fall back to VXLAN, say why in their logs, and the machines
still reach each other; once the segment carries it again, a later probe routes straight
again."""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from souq.model.machine import Machine
from souq.multihost import Host, Hosts
from souq.netns import missing
from souq.network.mesh import PROBE_DEADLINE_S, PROBE_INTERVAL_S, probe_address, worker_prefix
from souq.testing import wait_until
from tests.isolated import PRIVATE_NETWORK, machines_root
from tests.multihost.test_private_network import _client, _echo, _machine, _ready, _talk

pytestmark = [
    pytest.mark.skipif(missing() is not None, reason=f"hosts as namespaces: {missing()}"),
    *PRIVATE_NETWORK[1:],  # the root check is missing()'s
    pytest.mark.skipif(
        shutil.which("ping") is None or shutil.which("nft") is None,
        reason="the probes need ping (iputils-ping), the faults nft (nftables)",
    ),
]

# A failed probe is seen within one interval and one probe's deadline; one answered after the
# rule goes, within the first backed-off interval after that: margins of a loaded box beside.
FALLBACK_S = PROBE_INTERVAL_S + PROBE_DEADLINE_S + 20


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with (
        machines_root("souq-link-") as root,
        Hosts(
            root / "hosts",
            ["mad", "syd"],
            heartbeat_interval_s=0.5,
            private_network=True,
            underlay=lambda net: net.address,  # IPv4, on the bridge's one subnet
        ) as built,
    ):
        assert not any("--underlay-link" in h.agent.extra_args for h in built.hosts)
        yield built


def _link_local(host: Host) -> str:
    shown = host.net.exec("ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link")
    return shown.split()[3].split("/")[0]


def _route(host: Host, other: Host) -> str:
    return host.net.exec("ip", "-6", "route", "show", str(worker_prefix(other.worker_id)))


def _straight(host: Host, other: Host) -> bool:
    return f"via {_link_local(other)} dev eth0" in _route(host, other)


def _over_vxlan(host: Host, other: Host) -> bool:
    return re.search(r" dev sx[0-9a-f]+vx ", _route(host, other)) is not None


class _DropOnTheBridge:
    """An nftables ``bridge`` table in the root namespace: what ``match`` says dropped between
    the hosts' ports (default: IPv6 from fdaa::/16, what a segment without the workers'
    traffic does), the rest carried (IPv4, so VXLAN; neighbour discovery of the link-locals)."""

    def __init__(self, hosts: Hosts, match: str = "ip6 saddr fdaa::/16") -> None:
        self.table = f"{hosts.network.bridge}drop"
        self.match = match

    def __enter__(self) -> None:
        script = (
            f"add table bridge {self.table}\n"
            f"add chain bridge {self.table} forward "
            "{ type filter hook forward priority 0; }\n"
            f"add rule bridge {self.table} forward {self.match} counter drop\n"
        )
        subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True)

    def dropped(self) -> int:
        shown = subprocess.run(
            ["nft", "list", "table", "bridge", self.table],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return int(shown.split("counter packets ")[1].split()[0])

    def __exit__(self, *_: object) -> None:
        subprocess.run(["nft", "delete", "table", "bridge", self.table], check=False)


def _echo_and_talker(hosts: Hosts) -> tuple[str, str, Machine, Machine]:
    """Two apps of one organisation: an echo server on syd, a machine to talk to it on mad."""
    server_app, client_app = ("ln" + uuid.uuid4().hex[:10] for _ in range(2))
    with _client(hosts) as client:
        client.create_app(server_app, org_slug="acme")
        client.create_app(client_app, org_slug="acme")
    server = _echo(hosts, server_app, "syd")
    talker = _machine(hosts, client_app, "mad", ["sleep", "600"])
    return server_app, client_app, server, talker


def test_default_agents_on_one_ipv4_subnet_route_straight_once_probed(hosts: Hosts) -> None:
    mad, syd = hosts.hosts
    wait_until(
        lambda: _straight(mad, syd) and _straight(syd, mad),
        timeout=30,
        message="each /48 routed via the other's link-local on eth0",
    )
    assert "vx" not in _route(mad, syd) and "vx" not in _route(syd, mad)
    server_app, client_app, server, talker = _echo_and_talker(hosts)
    try:
        _ready(hosts, client_app, talker)
        assert server.private_ip is not None

        def talked() -> str | None:
            got = _talk(hosts, client_app, talker, f"{server_app}.internal", "by name")
            return got if got.startswith("OK") else None

        got = wait_until(talked, timeout=30, message=f"{server_app}.internal from mad")
        assert got == f"OK {server.private_ip} echo:by name"

        # The segment stops carrying fdaa traffic: both fall back to VXLAN and say why.
        with (drop := _DropOnTheBridge(hosts)):
            wait_until(
                lambda: _over_vxlan(mad, syd) and _over_vxlan(syd, mad),
                timeout=FALLBACK_S,
                message="both to fall back to VXLAN",
            )
            assert drop.dropped() > 0  # the probes were the ones dropped
            for host in (mad, syd):
                assert "over VXLAN: a probe from this worker's prefix" in host.agent.log_tail(
                    100_000
                )
            payload = "x" * 20_000  # beyond the VXLAN device's MTU

            def echoed() -> str | None:
                got = _talk(hosts, client_app, talker, f"{server_app}.internal", payload)
                return got if got.endswith(payload) else None

            reply = wait_until(echoed, timeout=30, message="the server to answer over VXLAN")
            assert reply == f"OK {server.private_ip} echo:{payload}"
        # Carried again: a later probe is answered, and both route straight again.
        wait_until(
            lambda: _straight(mad, syd) and _straight(syd, mad),
            timeout=FALLBACK_S,
            message="both straight again",
        )
        assert _talk(hosts, client_app, talker, server.private_ip, "again").endswith("echo:again")
    finally:
        with _client(hosts) as client:
            client.destroy(server_app, server.id, force=True)
            client.destroy(client_app, talker.id, force=True)


def test_a_worker_that_says_vxlan_is_reached_over_vxlan_by_a_default_one(hosts: Hosts) -> None:
    """syd's agent restarted with ``--underlay-link vxlan``: it publishes no link-local, so
    mad (the default) routes it over VXLAN, and it mad; both reach each other's machines."""
    mad, syd = hosts.hosts
    syd.agent.stop(timeout=10)
    syd.agent.extra_args = [*syd.agent.extra_args, "--underlay-link", "vxlan"]
    try:
        syd.agent.start()
        hosts.wait_workers_up([syd])
        wait_until(
            lambda: _over_vxlan(mad, syd) and _over_vxlan(syd, mad),
            timeout=30,
            message="both over VXLAN",
        )
    finally:
        syd.agent.stop(timeout=10)
        syd.agent.extra_args = syd.agent.extra_args[:-2]
        syd.agent.start()
        hosts.wait_workers_up([syd])


def test_each_worker_goes_the_way_its_own_probes_proved(hosts: Hosts) -> None:
    """Only mad's probes dropped (echo requests to syd's probe address): mad routes syd's /48
    over VXLAN, syd routes mad's straight, and the machines' packets, each direction its own
    way, still make their round trips (syd takes VXLAN from a link peer)."""
    mad, syd = hosts.hosts
    wait_until(
        lambda: _straight(mad, syd) and _straight(syd, mad), timeout=FALLBACK_S, message="straight"
    )
    server_app, client_app, server, talker = _echo_and_talker(hosts)
    requests = f"ip6 daddr {probe_address(syd.worker_id)} icmpv6 type echo-request"
    try:
        _ready(hosts, client_app, talker)
        assert server.private_ip is not None
        with _DropOnTheBridge(hosts, requests):
            wait_until(lambda: _over_vxlan(mad, syd), timeout=FALLBACK_S, message="mad on VXLAN")
            assert _straight(syd, mad)
            payload = "y" * 20_000
            got = _talk(hosts, client_app, talker, server.private_ip, payload)
            assert got == f"OK {server.private_ip} echo:{payload}"
            assert _straight(syd, mad)  # its probes were answered all along
    finally:
        with _client(hosts) as client:
            client.destroy(server_app, server.id, force=True)
            client.destroy(client_app, talker.id, force=True)
