"""The names scoped by network on a real cluster: an app created with a network of its own
(Fly's ``network`` on app create) and an app of another organisation are apart from the
default network's apps. The worker answering DNS advertises ``::1`` and listens there, so the
test's queries come from the address of the machine on it: the asker is that machine."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import dns.message
import dns.query
import dns.rcode
import pytest

from souq.natsserver import free_port
from souq.testing import Cluster, wait_until

CONFIG = {
    "cmd": ["sleep", "600"],
    "services": [{"internal_port": 8080}],
    "guest": {"cpus": 0.25, "memory_mb": 64},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, int]]:
    port = free_port()
    with Cluster(tmp_path_factory.mktemp("nets"), regions={}, cpus=2) as c:
        c.add_agent("mad", extra_args=["--advertise", "::1", "--dns", f"[::1]:{port}"])
        c.add_agent("lhr", extra_args=["--advertise", "fdaa:0:0:2::1"])
        c.wait_for_workers()
        yield c, port


def ask(port: int, name: str, rdtype: str = "AAAA") -> dns.message.Message:
    return dns.query.udp(dns.message.make_query(name, rdtype), "::1", port=port, timeout=5)


def apps(port: int) -> list[str]:
    got = ask(port, "_apps.internal", "TXT")
    text = b"".join(s for rrset in got.answer for rd in rrset for s in rd.strings).decode()
    return sorted(text.split(",")) if text else []


def test_an_asker_sees_only_its_own_network(cluster: tuple[Cluster, int]) -> None:
    c, port = cluster
    client = c.client()
    tag = uuid.uuid4().hex[:6]
    blue, blue_peer, plain = f"blue-{tag}", f"peer-{tag}", f"plain-{tag}"
    rival = f"rival-{tag}"
    client.create_app(blue, network=f"net-{tag}")
    client.create_app(blue_peer, network=f"net-{tag}")
    # Another organisation naming its network alike is on another network.
    client.create_app(rival, org_slug=f"org-{tag}", network=f"net-{tag}")
    # the other apps run on the other worker: the asker (::1) stays blue's machine
    client.wait(plain, client.create_machine(plain, "lhr", CONFIG).id, "started")
    client.wait(rival, client.create_machine(rival, "lhr", CONFIG).id, "started")
    client.wait(blue_peer, client.create_machine(blue_peer, "lhr", CONFIG).id, "started")
    me = client.wait(blue, client.create_machine(blue, "mad", CONFIG).id, "started")
    assert me.private_ip == "::1"
    wait_until(
        lambda: apps(port) == sorted([blue, blue_peer]),
        timeout=15,
        message="the blue network's apps alone",
    )
    assert ask(port, f"{plain}.internal").rcode() == dns.rcode.NXDOMAIN
    assert ask(port, f"{rival}.internal").rcode() == dns.rcode.NXDOMAIN
    peer = ask(port, f"{blue_peer}.internal")
    assert [rd.to_text() for rrset in peer.answer for rd in rrset] == ["fdaa:0:0:2::1"]
