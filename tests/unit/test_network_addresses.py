"""The private address layout: prefix, worker, network and machine bits; stable, distinct, and
collisions resolved to the next free value."""

from __future__ import annotations

import ipaddress

from souq.model.services import MachineAddress
from souq.network.addresses import (
    CLUSTER_PREFIX,
    AddressPool,
    PrivateAddress,
    edge_host,
    flycast_ip,
    flycast_mask,
    network_bits,
    network_bits_of,
    network_mask,
    network_of,
    private_address,
    worker_bits,
)


def _parts(ip: str) -> tuple[int, int, int]:
    value = int(ipaddress.IPv6Address(ip))
    return value >> 80 & 0xFFFFFFFF, value >> 48 & 0xFFFFFFFF, value & (1 << 48) - 1


def test_layout_puts_worker_network_and_machine_bits_in_their_places() -> None:
    pool = AddressPool("w1")
    got = pool.take("m1", network_of("acme"))
    assert ipaddress.IPv6Address(got.ip6) in CLUSTER_PREFIX
    worker, network, machine = _parts(got.ip6)
    assert worker == worker_bits("w1") and network == network_bits("org:acme") and machine
    assert ipaddress.IPv4Address(got.ip4) in pool.v4


def test_addresses_are_stable_and_distinct() -> None:
    one, two = AddressPool("w1"), AddressPool("w1")
    ids = [f"m{i}" for i in range(500)]
    first = [one.take(i, "n").ip6 for i in ids]
    assert [two.take(i, "n").ip6 for i in ids] == first  # same ids: same addresses
    assert len(set(first)) == len(first)
    assert len({one.take(i, "n").ip4 for i in ids}) == len(ids)
    assert _parts(AddressPool("w2").take("m0", "n").ip6)[0] != _parts(first[0])[0]


def test_a_collision_takes_the_next_free_value_and_a_restore_keeps_it() -> None:
    pool = AddressPool("w1", machine_hash=lambda _id: 7)
    a, b = pool.take("a", "n"), pool.take("b", "n")
    assert (_parts(a.ip6)[2], _parts(b.ip6)[2]) == (7, 8) and a.ip4 != b.ip4
    restarted = AddressPool("w1", machine_hash=lambda _id: 7)
    restarted.restore("b", b)  # b's record, read back after an agent restart
    assert _parts(restarted.take("a", "n").ip6)[2] == 7
    assert _parts(restarted.take("c", "n").ip6)[2] == 9  # 8 is b's still
    restarted.give_back("b")
    assert _parts(restarted.take("d", "n").ip6)[2] == 8


def test_networks_differ_and_the_mask_matches_a_network_on_any_worker() -> None:
    assert network_bits(network_of("acme")) != network_bits(network_of("other"))
    assert network_of("") == network_of("personal")
    # An app's own network is its organization's: another organization naming one alike
    # gets another network, never a way into the first's.
    assert network_bits(network_of("acme", "db")) != network_bits(network_of("other", "db"))
    assert network_of("acme", "db") != network_of("acme")
    a = AddressPool("w1").take("m", "n")
    b = AddressPool("w2").take("m", "n")
    base, mask = (int(ipaddress.IPv6Address(x)) for x in network_mask(network_bits("n")).split("/"))
    assert all(int(ipaddress.IPv6Address(x.ip6)) & mask == base for x in (a, b))
    other = AddressPool("w1").take("m", "other")
    assert int(ipaddress.IPv6Address(other.ip6)) & mask != base
    assert isinstance(a, PrivateAddress) and a.network == "n"


def test_an_apps_flycast_address_is_on_its_network_and_on_no_worker() -> None:
    network = network_of("acme")
    ip = flycast_ip(network, "web")
    worker, bits, app = _parts(ip)
    assert worker == 0 and bits == network_bits(network) and app
    assert ip != flycast_ip(network, "db") and ip == flycast_ip(network, "web")
    assert network_bits_of(ip) == network_bits(network) and network_bits_of("10.0.0.1") is None
    address, mask = flycast_mask(network).split("/")
    as_int = int(ipaddress.IPv6Address(mask))
    assert int(ipaddress.IPv6Address(ip)) & as_int == int(ipaddress.IPv6Address(address))
    # no machine's address of the network is in it: a machine's worker bits are never 0
    machine = AddressPool("w1").take("m1", network).ip6
    assert int(ipaddress.IPv6Address(machine)) & as_int != int(ipaddress.IPv6Address(address))


def test_edge_ports_go_on_an_ipv4_advertise_address_of_the_hosts_network_only() -> None:
    assert edge_host("10.1.2.3") == "10.1.2.3"
    for advertise in ("127.0.0.1", "0.0.0.0", "::1", "fd00::1", "worker.example", ""):
        assert edge_host(advertise) == "", advertise


def test_a_proxy_reaches_a_machine_at_its_edge_port_when_it_has_one() -> None:
    address = MachineAddress(
        host="100.64.0.5",
        ports={8080: 8080, 9090: 9090},
        private_ip="fdaa::5",
        ip4="100.64.0.5",
        network="org:acme",
        edge_host="10.1.2.3",
        edge_ports={8080: 20001},
    )
    assert address.reached_at(8080) == ("10.1.2.3", 20001)
    assert address.reached_at(9090) == ("100.64.0.5", 9090)  # not routed by the edge
    assert address.reached_at(1) is None
    assert private_address(address).edge == ((20001, 8080),)
