"""The routes between workers, as pure planning (souq.network.mesh): each worker's /48, its
VXLAN device's MAC and next hop from its id alone, the lines that go from one set of peers to
another, and the filter on VXLAN sources."""

from __future__ import annotations

import ipaddress

from souq.network.addresses import AddressPool
from souq.network.mesh import (
    Peer,
    changes,
    gateway_of,
    mac_of,
    mesh_rules,
    peers_of,
    wireguard_changes,
    worker_prefix,
)


def test_every_address_a_worker_gives_is_in_its_prefix() -> None:
    pool = AddressPool("w-one")
    prefix = worker_prefix("w-one")
    assert prefix.prefixlen == 48 and prefix.subnet_of(ipaddress.IPv6Network("fdaa::/16"))
    for i in range(20):
        address = pool.take(f"m{i}", f"net{i % 3}")
        assert ipaddress.IPv6Address(address.ip6) in prefix
    assert ipaddress.IPv6Address(AddressPool("w-two").take("m", "n").ip6) not in prefix


def test_a_workers_mac_and_next_hop_come_from_its_id() -> None:
    mac, gateway = mac_of("w-one"), gateway_of("w-one")
    assert mac == mac_of("w-one") and mac != mac_of("w-two")
    assert mac.startswith("02:") and len(mac.split(":")) == 6  # local, unicast
    assert ipaddress.IPv6Address(gateway).is_link_local
    assert gateway != gateway_of("w-two")


def test_peers_are_the_other_workers_that_say_where_they_are() -> None:
    heard = [
        ("me", "10.0.0.1", ""),
        ("a", "10.0.0.2", ""),
        ("b", "", ""),
        ("c", "no address", ""),
        ("d", "fd00::0:4", ""),
    ]
    assert peers_of(heard, "me") == {"a": Peer("a", "10.0.0.2"), "d": Peer("d", "fd00::4")}


def test_changes_add_new_peers_move_moved_ones_and_remove_gone_ones() -> None:
    a, b, b_moved, c = (
        Peer("a", "10.0.0.2"),
        Peer("b", "10.0.0.3"),
        Peer("b", "10.0.0.9"),
        Peer("c", "10.0.0.4"),
    )
    assert not changes("vx", "eth0", {"a": a}, {"a": a})
    todo = changes("vx", "eth0", {"a": a, "b": b}, {"b": b_moved, "c": c})
    assert todo.remove_bridge == [
        f"fdb del {mac_of('a')} dev vx dst 10.0.0.2",
        f"fdb del {mac_of('b')} dev vx dst 10.0.0.3",
    ]
    assert f"route del {worker_prefix('a')} via {gateway_of('a')} dev vx" in todo.remove_ip
    assert todo.add_bridge == [
        f"fdb replace {mac_of('b')} dev vx dst 10.0.0.9",
        f"fdb replace {mac_of('c')} dev vx dst 10.0.0.4",
    ]
    assert todo.add_ip == [
        f"neigh replace {gateway_of('b')} lladdr {mac_of('b')} dev vx nud permanent",
        f"route replace {worker_prefix('b')} via {gateway_of('b')} dev vx",
        f"neigh replace {gateway_of('c')} lladdr {mac_of('c')} dev vx nud permanent",
        f"route replace {worker_prefix('c')} via {gateway_of('c')} dev vx",
    ]


def test_vxlan_is_taken_from_known_peers_only() -> None:
    peers = [Peer("a", "10.0.0.2"), Peer("b", "fd00::2")]
    four = mesh_rules("SOUQ-x-MESH", peers, 4)
    assert "-A SOUQ-x-MESH -s 10.0.0.2/32 -j ACCEPT" in four and "fd00::2" not in four
    assert four.splitlines()[-2:] == ["-A SOUQ-x-MESH -j DROP", "COMMIT"]
    assert "-A SOUQ-x-MESH -s fd00::2/128 -j ACCEPT" in mesh_rules("SOUQ-x-MESH", peers, 6)


def test_a_peer_on_this_hosts_link_is_routed_to_straight() -> None:
    subnet = ipaddress.IPv6Network("fd5a:1::/64")
    heard = [("a", "fd5a:1::11", ""), ("b", "fd5b::12", ""), ("c", "10.0.0.4", "")]
    peers = peers_of(heard, "me", lambda address: address in subnet)
    assert [p.direct for p in peers.values()] == [True, False, False]
    todo = changes("vx", "eth0", {}, peers)
    assert f"route replace {worker_prefix('a')} via fd5a:1::11 dev eth0" in todo.add_ip
    assert not any(mac_of("a") in line for line in todo.add_bridge + todo.add_ip)
    # Moved off the link: the straight route goes, the VXLAN entries come.
    moved = {"a": Peer("a", "fd5c::11")}
    todo = changes("vx", "eth0", {"a": peers["a"]}, moved)
    assert todo.remove_ip == [f"route del {worker_prefix('a')} via fd5a:1::11 dev eth0"]
    assert todo.add_bridge == [f"fdb replace {mac_of('a')} dev vx dst fd5c::11"]
    # A peer routed straight sends no VXLAN: the filter does not take it from it.
    assert "fd5a:1::11" not in mesh_rules("C", peers.values(), 6)


def test_wireguard_peers_are_the_keyed_ones_each_allowed_its_own_prefix() -> None:
    a, b = Peer("a", "10.0.0.2", key="KA="), Peer("b", "fd00::3", key="KB=")
    clear = Peer("c", "10.0.0.4")
    todo = wireguard_changes("wg", {}, {"a": a, "b": b, "c": clear})
    assert todo.wg == [
        ["peer", "KA=", "endpoint", "10.0.0.2:51820", "allowed-ips", str(worker_prefix("a"))],
        ["peer", "KB=", "endpoint", "[fd00::3]:51820", "allowed-ips", str(worker_prefix("b"))],
    ]
    assert todo.add_ip == [
        f"route replace {worker_prefix('a')} dev wg",
        f"route replace {worker_prefix('b')} dev wg",
    ]
    # b moved: set again (same key: not removed); a's key changed: the old one removed.
    a2, b2 = Peer("a", "10.0.0.2", key="KA2="), Peer("b", "fd00::9", key="KB=")
    todo = wireguard_changes("wg", {"a": a, "b": b}, {"a": a2, "b": b2})
    assert ["peer", "KA=", "remove"] in todo.wg and ["peer", "KB=", "remove"] not in todo.wg
    assert [
        "peer",
        "KB=",
        "endpoint",
        "[fd00::9]:51820",
        "allowed-ips",
        str(worker_prefix("b")),
    ] in todo.wg
    assert not wireguard_changes("wg", {"a": a}, {"a": a})


def test_a_peer_over_an_ipv4_link_is_routed_to_straight_via_its_link_local() -> None:
    over = Peer("a", "10.0.0.2", direct=True, link="fe80::a")
    assert over.next_hop == "fe80::a" and Peer("b", "fd5a::b", direct=True).next_hop == "fd5a::b"
    todo = changes("vx", "eth0", {}, {"a": over})
    assert todo.add_ip == [f"route replace {worker_prefix('a')} via fe80::a dev eth0"]
    assert not todo.add_bridge  # no VXLAN entry for it
    # Off the link again (it said vxlan): the straight route goes, the VXLAN entries come.
    todo = changes("vx", "eth0", {"a": over}, {"a": Peer("a", "10.0.0.2")})
    assert todo.remove_ip == [f"route del {worker_prefix('a')} via fe80::a dev eth0"]
    assert todo.add_bridge == [f"fdb replace {mac_of('a')} dev vx dst 10.0.0.2"]
    assert "10.0.0.2" not in mesh_rules("C", [over], 4)  # it sends no VXLAN: none taken


def test_only_both_saying_direct_on_one_ipv4_subnet_go_straight() -> None:
    from souq.network.overlay import Overlay

    overlay = Overlay("me", "abcdef", "10.0.0.1", link_direct=True)
    overlay._link = [ipaddress.IPv4Network("10.0.0.0/24")]  # as start() reads the device's
    peer, far = Peer("a", "10.0.0.2"), Peer("b", "10.9.0.2")
    assert overlay._over_link(peer, "fe80::a") == peer  # this host published no link-local
    overlay.link_local = "fe80::1"
    assert overlay._over_link(peer, "fe80::a") == Peer("a", "10.0.0.2", True, link="fe80::a")
    assert overlay._over_link(peer, "") == peer  # it says vxlan: VXLAN both ways
    assert overlay._over_link(far, "fe80::b") == far  # another subnet: routers between
