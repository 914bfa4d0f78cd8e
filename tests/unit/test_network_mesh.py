"""The routes between workers, as pure planning (souq.network.mesh): each worker's /48, its
VXLAN device's MAC and next hop from its id alone, the lines that go from one set of peers to
another, the filter on VXLAN sources, and the way of a peer on this host's IPv4 link: straight
once a probe of that link answered (auto), and when the probes are due."""

from __future__ import annotations

import ipaddress

from souq.network.addresses import AddressPool
from souq.network.mesh import (
    LinkProbe,
    MeshChanges,
    Peer,
    UnderlayLink,
    changes,
    due_at,
    gateway_of,
    mac_of,
    mesh_rules,
    next_probe_at,
    over_link,
    peers_of,
    probe_address,
    probe_command,
    probes_due,
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
    # b's neighbour and route name its MAC and next hop, not its address: they stay.
    assert todo.add_ip == [
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
    # Moved off the link: the VXLAN entries come, the route replaced in place.
    moved = {"a": Peer("a", "fd5c::11")}
    todo = changes("vx", "eth0", {"a": peers["a"]}, moved)
    assert not todo.remove_ip
    assert todo.add_bridge == [f"fdb replace {mac_of('a')} dev vx dst fd5c::11"]
    assert todo.add_ip[-1] == f"route replace {worker_prefix('a')} via {gateway_of('a')} dev vx"
    # Gone: its route removed.
    todo = changes("vx", "eth0", {"a": peers["a"]}, {})
    assert todo.remove_ip == [f"route del {worker_prefix('a')} via fd5a:1::11 dev eth0"]
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


def test_a_link_peer_keeps_its_vxlan_entries_and_changes_way_by_one_route_replace() -> None:
    link = Peer("a", "10.0.0.2", link="fe80::a")  # over VXLAN until its link is proven
    straight = Peer("a", "10.0.0.2", direct=True, link="fe80::a")
    assert (
        straight.next_hop == "fe80::a" and Peer("b", "fd5a::b", direct=True).next_hop == "fd5a::b"
    )
    probe = f"route replace {probe_address('a')}/128 via fe80::a dev eth0"
    todo = changes("vx", "eth0", {}, {"a": link})
    assert todo.add_bridge == [f"fdb replace {mac_of('a')} dev vx dst 10.0.0.2"]
    assert todo.add_ip == [
        f"neigh replace {gateway_of('a')} lladdr {mac_of('a')} dev vx nud permanent",
        f"route replace {worker_prefix('a')} via {gateway_of('a')} dev vx",
        probe,  # the probe goes over the link whichever way the /48 goes
    ]
    # Proven: one line, no removal (no moment without a route), and back the same way.
    todo = changes("vx", "eth0", {"a": link}, {"a": straight})
    assert todo == MeshChanges(
        [], [], [f"route replace {worker_prefix('a')} via fe80::a dev eth0"], []
    )
    todo = changes("vx", "eth0", {"a": straight}, {"a": link})
    assert todo.add_ip == [f"route replace {worker_prefix('a')} via {gateway_of('a')} dev vx"]
    assert not (todo.remove_ip or todo.remove_bridge or todo.add_bridge)
    # No longer a link peer (it says vxlan): the probe's route goes.
    todo = changes("vx", "eth0", {"a": straight}, {"a": Peer("a", "10.0.0.2")})
    assert todo.remove_ip == [f"route del {probe_address('a')}/128 via fe80::a dev eth0"]
    # A link peer may send VXLAN whichever way this worker goes: the filter takes it.
    assert "-s 10.0.0.2/32 -j ACCEPT" in mesh_rules("C", [straight], 4)


def test_the_probe_address_is_in_the_workers_prefix_and_no_machines() -> None:
    address = ipaddress.IPv6Address(probe_address("w-one"))
    assert address in worker_prefix("w-one")
    pool = AddressPool("w-one")
    assert all(pool.take(f"m{i}", f"net{i}").ip6 != str(address) for i in range(50))
    assert int(address) >> 48 & 0xFFFFFFFF == 0  # network bits 0: no network's
    argv = probe_command(probe_address("me"), probe_address("a"), 2.0)
    assert argv[:2] == ["ping", "-6"] and argv[-3:] == [
        "-I",
        probe_address("me"),
        probe_address("a"),
    ]


_SUBNET = ipaddress.IPv4Network("10.0.0.0/24")


def _way(peer: Peer, link: str, mode: UnderlayLink = "auto", **kw: object) -> tuple[Peer, str]:
    fields: dict = {"own_link": "fe80::1", "on_link": lambda a: a in _SUBNET, **kw}
    return over_link(peer, link, mode=mode, **fields)


def test_auto_routes_a_link_peer_straight_only_once_a_probe_of_that_link_answered() -> None:
    peer = Peer("a", "10.0.0.2")
    candidate, straight = (
        Peer("a", "10.0.0.2", link="fe80::a"),
        Peer("a", "10.0.0.2", True, link="fe80::a"),
    )
    assert _way(peer, "fe80::a") == (candidate, "not probed yet")
    answered = LinkProbe("fe80::a", 5.0, answered=True)
    assert _way(peer, "fe80::a", probe=answered)[0] == straight
    silent = LinkProbe("fe80::a", 5.0, answered=False, failures=2)
    routed, why = _way(peer, "fe80::a", probe=silent)
    assert routed == candidate and "got no answer" in why
    # A probe of a link-local it no longer publishes proves nothing.
    assert _way(peer, "fe80::b", probe=answered) == (
        Peer("a", "10.0.0.2", link="fe80::b"),
        "not probed yet",
    )
    # Forced ways, and no link peer at all.
    assert _way(peer, "fe80::a", "direct") == (straight, "--underlay-link direct")
    assert _way(peer, "fe80::a", "vxlan") == (peer, "--underlay-link vxlan")
    assert (
        _way(peer, "", probe=answered)[1]
        == "it publishes no link-local address (--underlay-link vxlan)"
    )
    assert _way(peer, "fe80::a", own_link="")[0] == peer
    far = Peer("b", "10.9.0.2")
    assert _way(far, "fe80::b") == (far, "its underlay address is not on this host's IPv4 subnet")
    six = Peer("c", "fd5a::c", direct=True)
    assert _way(six, "", "vxlan")[0] == six  # straight over IPv6 whatever the mode


def test_probes_are_due_at_once_when_heard_then_on_a_slow_timer_backing_off_while_silent() -> None:
    assert due_at(None, "fe80::a") == 0.0
    assert due_at(LinkProbe("fe80::a", 100.0, True), "fe80::a", 15.0) == 115.0
    assert due_at(LinkProbe("fe80::a", 100.0, True), "fe80::b", 15.0) == 0.0  # another link
    assert due_at(LinkProbe("fe80::a", 100.0, True, recheck=True), "fe80::a") == 0.0
    silent = [
        due_at(LinkProbe("fe80::a", 100.0, False, n), "fe80::a", 15.0, 120.0)
        for n in (1, 2, 3, 4, 9)
    ]
    assert silent == [115.0, 130.0, 160.0, 220.0, 220.0]
    peers = {
        "a": Peer("a", "10.0.0.2", link="fe80::a"),
        "b": Peer("b", "10.0.0.3"),
        "c": Peer("c", "10.0.0.4", link="fe80::c"),
    }
    probes = {"a": LinkProbe("fe80::a", 100.0, True)}
    assert [p.worker_id for p in probes_due(peers, probes, 101.0, 15.0)] == ["c"]  # b: no link
    assert [p.worker_id for p in probes_due(peers, probes, 115.0, 15.0)] == ["a", "c"]
    probes["c"] = LinkProbe("fe80::c", 101.0, False, 1)
    assert next_probe_at(peers, probes, 15.0) == 115.0
    assert next_probe_at({"b": peers["b"]}, probes) is None


def test_auto_is_the_default_and_only_a_link_peer_on_one_ipv4_subnet_is_probed() -> None:
    from souq.agent.config import AgentConfig
    from souq.network.overlay import Overlay

    assert AgentConfig.model_fields["underlay_link"].default == "auto"
    overlay = Overlay("me", "abcdef", "10.0.0.1", link="auto")
    overlay._link = [ipaddress.IPv4Network("10.0.0.0/24")]  # as start() reads the device's
    overlay._can_probe = True  # as start() finds ping
    peer, far = Peer("a", "10.0.0.2"), Peer("b", "10.9.0.2")
    assert not overlay.probing  # this host published no link-local
    assert overlay._way(peer, "fe80::a") == peer
    overlay.link_local = "fe80::1"
    assert overlay.probing
    assert overlay._way(peer, "fe80::a") == Peer("a", "10.0.0.2", link="fe80::a")
    assert overlay._way(peer, "") == peer  # it says vxlan: VXLAN both ways
    assert overlay._way(far, "fe80::b") == far  # another subnet: routers between
    overlay._now = {"a": Peer("a", "10.0.0.2", link="fe80::a"), "b": far}
    assert [p.worker_id for p in overlay.probes_due(0.0)] == ["a"]
