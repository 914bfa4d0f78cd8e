"""The fast path's nftables text (souq.network.fastpath): what it forwards is what the worker's
chains accept between machines of one network, and nothing else."""

from __future__ import annotations

from souq.network.addresses import AddressPool, network_bits, network_mask, network_of
from souq.network.fastpath import (
    Hop,
    MachineLink,
    hops_of,
    machine_removal,
    machine_script,
    route_script,
    table_script,
)
from souq.network.mesh import VXLAN_PORT, Peer, gateway_of, worker_prefix

ACME = network_of("acme")


def _machine() -> MachineLink:
    ip6 = AddressPool("w1").take("m1", ACME).ip6
    return MachineLink("sxabcdefm001", ip6, ACME)


def test_out_of_a_machine_only_from_its_address_to_its_network() -> None:
    m = _machine()
    text = machine_script("abcdef", m)
    address, mask = network_mask(network_bits(ACME)).split("/")
    assert (
        f'add chain netdev souq-abcdef out-{m.link} {{ type filter hook ingress device "{m.link}"'
        in text
    )
    assert f"out-{m.link} ip6 saddr {m.ip6} ip6 daddr & {mask} == {address} goto peers" in text


def test_into_a_machine_only_from_its_network() -> None:
    m = _machine()
    text = machine_script("abcdef", m)
    address, mask = network_mask(network_bits(ACME)).split("/")
    assert (
        f'in-{m.link} ip6 saddr & {mask} == {address} counter fwd ip6 to {m.ip6} device "{m.link}"'
    ) in text
    assert f"machines {{ {m.ip6} : goto in-{m.link} }}" in text
    gone = machine_removal("abcdef", m)
    assert f"delete element netdev souq-abcdef machines {{ {m.ip6} }}" in gone
    assert f"delete chain netdev souq-abcdef out-{m.link}" in gone


def test_the_peers_by_the_device_of_their_route() -> None:
    peers = {
        "w2": Peer("w2", "fd5a::b", direct=True),
        "w3": Peer("w3", "10.0.0.3"),
    }
    hops = hops_of(peers, "eth0", 1500, "sxabcdefvx", 1450)
    assert hops == [
        Hop("eth0", 1500, {str(worker_prefix("w2")): "fd5a::b"}),
        Hop("sxabcdefvx", 1450, {str(worker_prefix("w3")): gateway_of("w3")}),
    ]
    text = route_script("abcdef", hops)
    # Never VXLAN's own port (a frame of a machine's making), as the worker's chain drops it.
    assert f"add rule netdev souq-abcdef peers udp dport {VXLAN_PORT} return" in text
    # Straight: as big as the machine's link; into VXLAN: what fits, the rest by the kernel.
    assert 'peers counter fwd ip6 to ip6 daddr map @to-eth0 device "eth0"' in text
    assert "peers meta length <= 1450 counter fwd ip6 to ip6 daddr map @to-sxabcdefvx" in text
    assert f"to-eth0 {{ {worker_prefix('w2')} : fd5a::b }}" in text
    for device in ("eth0", "sxabcdefvx"):
        assert f"add rule netdev souq-abcdef from-{device} ip6 daddr vmap @machines" in text


def test_a_device_no_longer_routed_loses_its_chain() -> None:
    text = route_script("abcdef", [Hop("sxabcdefvx", 1450, {})], before=["eth0", "sxabcdefvx"])
    assert "delete chain netdev souq-abcdef from-eth0" in text
    assert "delete map netdev souq-abcdef to-eth0" in text
    assert "delete chain netdev souq-abcdef from-sxabcdefvx" not in text


def test_the_table_is_made_whole_in_one_transaction() -> None:
    m = _machine()
    text = table_script("abcdef", [m])
    lines = text.splitlines()
    # Made if absent, then deleted and made anew: one nft -f, so never seen half made.
    assert lines[:3] == [
        "table netdev souq-abcdef {}",
        "delete table netdev souq-abcdef",
        "add table netdev souq-abcdef",
    ]
    # The peers' chain comes before the machines' chains that go to it.
    peers = lines.index("add chain netdev souq-abcdef peers")
    assert peers < next(i for i, line in enumerate(lines) if "goto peers" in line)


def test_a_peer_over_an_ipv4_link_goes_out_of_the_underlay_device_to_its_link_local() -> None:
    peers = {"w2": Peer("w2", "10.0.0.2", direct=True, link="fe80::b")}
    (straight, _) = hops_of(peers, "eth0", 1500, "sxabcdefvx", 1450)
    assert straight == Hop("eth0", 1500, {str(worker_prefix("w2")): "fe80::b"})
