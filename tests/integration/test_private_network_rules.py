"""A machine's namespace and firewall rules made and removed by :class:`WorkerNetwork` alone
(root, real ``ip``, ``iptables`` and ``ip6tables``): its rules are in every chain of both
families once made and none is left once removed; a namespace half made (its link gone) is
made again whole."""

from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from souq.network import links
from souq.network.addresses import AddressPool, PrivateAddress
from tests.isolated import PRIVATE_NETWORK

pytestmark = PRIVATE_NETWORK


def _rules(net: links.WorkerNetwork, address: PrivateAddress) -> dict[str, int]:
    """How many rules of each of the worker's chains name the machine's address."""
    counts = {}
    for tool, table, chain, ip in (
        ("ip6tables", "filter", net.fwd, address.ip6),
        ("ip6tables", "filter", net.into, address.ip6),
        ("ip6tables", "nat", net.fly, address.ip6),
        ("iptables", "filter", net.fwd, address.ip4),
    ):
        out = subprocess.run(
            [tool, "-w", "-t", table, "-S", chain], capture_output=True, text=True, check=True
        ).stdout
        counts[f"{tool} {chain}"] = sum(ip in line for line in out.splitlines())
    return counts


@pytest.fixture
def network(tmp_path: Path) -> Iterator[tuple[links.WorkerNetwork, AddressPool]]:
    worker = "test-" + uuid.uuid4().hex[:8]
    net = links.WorkerNetwork(worker, tmp_path)
    net.start([])
    try:
        yield net, AddressPool(worker)
    finally:
        net.sweep(set(), set())
        net.stop_rules()
        net.fast.stop()


def test_rules_of_both_families_made_then_removed(
    network: tuple[links.WorkerNetwork, AddressPool],
) -> None:
    net, pool = network
    address = pool.take("m1", "net")
    net.ensure("m1", address)
    made = _rules(net, address)
    assert all(made.values()), made  # every chain holds the machine's rules
    net.remove("m1", address)
    assert not any(_rules(net, address).values())
    assert not net.exists("m1", address)


def test_a_namespace_half_made_is_made_again(
    network: tuple[links.WorkerNetwork, AddressPool],
) -> None:
    net, pool = network
    address = pool.take("m2", "net")
    names = net.names("m2", address)
    subprocess.run(["ip", "netns", "add", names.netns], check=True)  # no link: half made
    path = net.ensure("m2", address)
    assert net.exists("m2", address)
    inside = subprocess.run(
        ["ip", "-n", names.netns, "-o", "addr", "show", "dev", "eth0"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert address.ip6 in inside and address.ip4 in inside
    assert path == links.NETNS_DIR / names.netns
    net.remove("m2", address)


def _fast_entries(net: links.WorkerNetwork) -> str:
    """The fast path's table as nft lists it ("" when it has none)."""
    done = subprocess.run(
        ["nft", "list", "table", "netdev", f"souq-{net.tag}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout


def test_the_fast_path_entry_is_added_once_started_and_never_after_a_removal(
    network: tuple[links.WorkerNetwork, AddressPool],
) -> None:
    net, pool = network
    if not net.fast.on:
        pytest.skip(f"no fast path here: {net.fast.why_not}")
    address = pool.take("m3", "net")
    link = net.names("m3", address).link
    net.ensure("m3", address)
    assert f"in-{link}" not in _fast_entries(net)  # made without it: the claim's path is shorter
    net.started("m3", address)
    net.fast.settled(timeout=30)
    assert f"in-{link}" in _fast_entries(net) and address.ip6 in _fast_entries(net)
    net.remove("m3", address)
    assert f"in-{link}" not in _fast_entries(net)
    # Removed before its entry is added (the thread busy): the entry is never added.
    again = pool.take("m4", "net")
    net.ensure("m4", again)
    busy = threading.Event()
    assert net.fast._adder is not None  # (the thread the first entry was added in)
    net.fast._adder.submit(busy.wait, 30)
    net.started("m4", again)
    net.remove("m4", again)
    busy.set()
    net.fast.settled(timeout=30)
    assert f"in-{net.names('m4', again).link}" not in _fast_entries(net)
