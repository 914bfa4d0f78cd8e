"""The names on a real cluster: nats-server, a broker, two agents (one region each), the first
answering DNS on loopback (``--dns``), asked by dnspython as a client.

Until every machine has a private address of its own, a machine's ``private_ip`` is its
worker's advertised host: each agent advertises an IPv6 address of its own, so that one
machine per worker has one address (the test reads the expected addresses from the records,
whatever gives them)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator

import dns.message
import dns.query
import dns.rcode
import pytest

from souq.model import Machine
from souq.natsserver import free_port
from souq.network.name_feed import private_address
from souq.testing import Cluster, wait_until
from tests import dns_upstream

CONFIG = {"cmd": ["sleep", "600"], "services": [{"internal_port": 8080}]}


@pytest.fixture(scope="module")
def upstream_port() -> Iterator[int]:
    with dns_upstream.responder_thread() as port:
        yield port


@pytest.fixture(scope="module")
def names(
    tmp_path_factory: pytest.TempPathFactory, upstream_port: int
) -> Iterator[tuple[Cluster, tuple[str, int]]]:
    listen = ("127.0.0.1", free_port())
    with Cluster(tmp_path_factory.mktemp("names"), regions={}, cpus=2) as c:
        c.add_agent(
            "mad",
            extra_args=[
                "--advertise",
                "fdaa:0:0:1::1",
                "--dns",
                f"{listen[0]}:{listen[1]}",
                "--dns-upstream",
                f"127.0.0.1:{upstream_port}",
            ],
        )
        c.add_agent("lhr", extra_args=["--advertise", "fdaa:0:0:2::1"])
        c.wait_for_workers()
        yield c, listen


def ask(listen: tuple[str, int], name: str, rdtype: str = "AAAA") -> dns.message.Message:
    query = dns.message.make_query(name, rdtype)
    return dns.query.udp(query, listen[0], port=listen[1], timeout=5)


def aaaa(listen: tuple[str, int], name: str) -> set[str] | None:
    """The addresses ``name`` answers (None: NXDOMAIN)."""
    got = ask(listen, name)
    if got.rcode() == dns.rcode.NXDOMAIN:
        return None
    assert got.rcode() == dns.rcode.NOERROR, got
    return {rd.to_text() for rrset in got.answer for rd in rrset}


def address(m: Machine) -> str:
    ip = private_address(m.private_ip)
    assert ip is not None, f"machine {m.id} has no IPv6 private_ip: {m.private_ip!r}"
    return ip


def resolves(listen: tuple[str, int], name: str, want: set[str] | None) -> None:
    wait_until(lambda: aaaa(listen, name) == want, timeout=15, message=f"{name} to answer {want}")


def test_an_apps_names_follow_its_machines(names: tuple[Cluster, tuple[str, int]]) -> None:
    cluster, listen = names
    client = cluster.client()
    app = "n" + uuid.uuid4().hex[:8]
    assert aaaa(listen, f"{app}.internal") is None  # no such app yet: NXDOMAIN
    a = client.wait(app, client.create_machine(app, "mad", CONFIG).id, "started")
    b = client.wait(app, client.create_machine(app, "lhr", CONFIG).id, "started")
    assert address(a) != address(b)
    resolves(listen, f"{app}.internal", {address(a), address(b)})
    assert aaaa(listen, f"lhr.{app}.internal") == {address(b)}
    assert aaaa(listen, f"{a.id}.vm.{app}.internal") == {address(a)}
    assert aaaa(listen, f"top1.nearest.of.{app}.internal") is not None
    txt = ask(listen, "_apps.internal", "TXT")
    assert app in b"".join(s for rd in txt.answer[0] for s in rd.strings).decode().split(",")
    empty = ask(listen, f"{app}.internal", "A")
    assert empty.rcode() == dns.rcode.NOERROR and not empty.answer

    # stopped: it leaves the answers once its event is in (the name stays: NOERROR)
    client.stop(app, a.id)
    resolves(listen, f"{app}.internal", {address(b)})
    assert aaaa(listen, f"{a.id}.vm.{app}.internal") == set()
    assert aaaa(listen, f"mad.{app}.internal") == set()  # a region Souq knows, nothing there
    # destroyed: its own name goes
    client.wait(app, a.id, "stopped")
    client.destroy(app, a.id)
    wait_until(
        lambda: aaaa(listen, f"{a.id}.vm.{app}.internal") is None,
        timeout=15,
        message="the destroyed machine's name to go",
    )
    # a new machine resolves once it has started
    c = client.wait(app, client.create_machine(app, "mad", CONFIG).id, "started")
    resolves(listen, f"{app}.internal", {address(b), address(c)})
    # the last one destroyed: the app is gone
    client.destroy(app, b.id, force=True)
    client.destroy(app, c.id, force=True)
    resolves(listen, f"{app}.internal", None)


def test_names_outside_internal_are_forwarded(names: tuple[Cluster, tuple[str, int]]) -> None:
    _, listen = names
    got = ask(listen, "example.test", "A")
    assert got.rcode() == dns.rcode.NOERROR
    assert [rd.to_text() for rrset in got.answer for rd in rrset] == [dns_upstream.ADDRESS]


def test_the_names_outlive_a_nats_outage_and_catch_up(
    names: tuple[Cluster, tuple[str, int]],
) -> None:
    """Last in this module: it stops the cluster's NATS. Meanwhile the names answer as the
    view last was; a machine that stopped while the bus was down leaves them once it is back."""
    cluster, listen = names
    client = cluster.client()
    app = "o" + uuid.uuid4().hex[:8]
    config = {**CONFIG, "restart": {"policy": "no"}}
    m = client.wait(app, client.create_machine(app, "mad", config).id, "started")
    resolves(listen, f"{app}.internal", {address(m)})
    assert m.pid is not None
    cluster.nats.stop(keep_store=True)
    try:
        assert aaaa(listen, f"{app}.internal") == {address(m)}  # still answering, from the view
        os.kill(m.pid, signal.SIGKILL)  # it exits while nobody hears of it
    finally:
        cluster.nats.start()
    resolves(listen, f"{app}.internal", set())
    n = client.wait(app, client.create_machine(app, "mad", config).id, "started")
    resolves(listen, f"{app}.internal", {address(n)})
