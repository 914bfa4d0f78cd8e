"""Routes between workers: what each worker's host needs so that its machines reach the
machines of every other worker, decided from what the workers publish (pure; the devices and
rules are :mod:`souq.network.overlay`'s).

Every worker owns a /48 of the cluster's prefix (:func:`worker_prefix`, from its id), so one
route per other worker carries its machines' traffic. A worker says where it is reached in its
fingerprint (``underlay``: an address of its host, IPv4 or IPv6); the others learn it from its
heartbeats, as they learn its capacity. No agreement beyond that is needed.

Where the other worker's underlay address is IPv6 and on this host's own link (hosts on one
segment), its /48 is routed straight to that address (``direct``): no encapsulation, the
kernel's forwarding alone. Where it is IPv4 on this host's own IPv4 subnet and both workers
say so (``--underlay-link direct``: each then publishes its underlay device's IPv6 link-local
address, ``underlay_link``), the same, via that link-local address (:attr:`Peer.link`): the
segment carries the IPv6 frames as it carries the IPv4 ones. Elsewhere the hosts' network may
not carry the cluster's ULA prefix (an IPv4-only underlay: the kernel routes no IPv6 via an
IPv4 next hop; a provider's router), so the route goes over a VXLAN device per worker (the
kernel's; UDP :data:`VXLAN_PORT` between the hosts' underlay addresses, no learning, no
flooding):

* the device's MAC and link-local address are the worker's (:func:`mac_of`, :func:`gateway_of`:
  its 32 worker bits), so another worker's entry for it is known from its id alone;
* per other worker: a permanent neighbour (its link-local → its MAC), a forwarding entry (its
  MAC → its underlay address) and the route of its /48 via its link-local address.

:func:`changes` turns the peers now set up and the peers wanted into the ``ip -batch`` and
``bridge -batch`` lines that go from one to the other; :func:`mesh_rules` is the filter that
takes VXLAN packets from known peers only.

Where the hosts' network is not trusted, each worker runs a WireGuard device instead
(:func:`wireguard_changes`): its public key in its fingerprint too, and per other worker a
WireGuard peer (its key, its underlay address and :data:`WG_PORT`, its /48 as the peer's only
allowed addresses: what comes out of the tunnel from that peer is from that peer's machines,
by cryptography) and the route of its /48 into the device. A worker without a key is not
routed to at all from a worker that encrypts.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from souq.network.addresses import CLUSTER_PREFIX, worker_bits

__all__ = [
    "VNI",
    "VXLAN_OVERHEAD",
    "VXLAN_PORT",
    "WG_PORT",
    "MeshChanges",
    "Peer",
    "changes",
    "gateway_of",
    "mac_of",
    "mesh_rules",
    "peers_of",
    "wireguard_changes",
    "worker_prefix",
]

VXLAN_PORT = 4789  # IANA's
VNI = 0x6AA  # the cluster network's VXLAN id: one for every worker
VXLAN_OVERHEAD = 50  # bytes a VXLAN frame adds over IPv4 (70 over IPv6)
WG_PORT = 51820  # WireGuard's usual port: every worker's
WG_OVERHEAD = 60  # bytes WireGuard adds over IPv4 (80 over IPv6)
_PREFIX = int(CLUSTER_PREFIX.network_address)


def worker_prefix(worker_id: str) -> ipaddress.IPv6Network:
    """The worker's /48: every private address it gives is in it."""
    return ipaddress.IPv6Network((_PREFIX | worker_bits(worker_id) << 80, 48))


def mac_of(worker_id: str) -> str:
    """The MAC of the worker's VXLAN device (locally administered, unicast)."""
    bits = worker_bits(worker_id)
    return "02:5a:" + ":".join(f"{bits >> shift & 0xFF:02x}" for shift in (24, 16, 8, 0))


def gateway_of(worker_id: str) -> str:
    """The link-local address of the worker's VXLAN device: the next hop to its /48."""
    value = 0xFE80 << 112 | 0x5A << 32 | worker_bits(worker_id)
    return str(ipaddress.IPv6Address(value))


@dataclass(frozen=True)
class Peer:
    """Another worker, as far as the routes go: its id, its host's underlay address, and
    whether that address is on this host's link (routed to straight, not over VXLAN)."""

    worker_id: str
    underlay: str
    direct: bool = False
    key: str = ""  # its WireGuard public key (empty: it has none)
    link: str = ""  # direct over an IPv4 link: its underlay device's IPv6 link-local address

    @property
    def prefix(self) -> ipaddress.IPv6Network:
        return worker_prefix(self.worker_id)

    @property
    def next_hop(self) -> str:
        """Where its /48 goes when it is routed straight: its link-local or IPv6 address."""
        return self.link or self.underlay


def peers_of(
    workers: Iterable[tuple[str, str, str]],
    own: str,
    on_link: Callable[[ipaddress.IPv6Address], bool] = lambda _: False,
) -> dict[str, Peer]:
    """The peers among ``(worker id, underlay, WireGuard key)``: every worker but ``own``
    that says where it is reached (a valid address), direct where ``on_link`` says its IPv6
    address is on this host's link; the last of a worker wins."""
    peers: dict[str, Peer] = {}
    for worker_id, underlay, key in workers:
        if worker_id == own or not underlay:
            continue
        try:
            address = ipaddress.ip_address(underlay)
        except ValueError:
            continue
        direct = isinstance(address, ipaddress.IPv6Address) and on_link(address)
        peers[worker_id] = Peer(worker_id, address.compressed, direct, key)
    return peers


@dataclass(frozen=True)
class MeshChanges:
    """Lines for ``ip -batch`` and ``bridge -batch``: what to remove (which may be gone
    already), then what to add; all empty: nothing to do."""

    remove_ip: list[str]
    remove_bridge: list[str]
    add_ip: list[str]
    add_bridge: list[str]
    wg: list[list[str]] = field(default_factory=list)  # ``wg set DEVICE ...`` arguments

    def __bool__(self) -> bool:
        return bool(
            self.remove_ip or self.remove_bridge or self.add_ip or self.add_bridge or self.wg
        )


def changes(
    device: str, parent: str, now: Mapping[str, Peer], wanted: Mapping[str, Peer]
) -> MeshChanges:
    """What takes the peers from ``now`` to ``wanted``, over the VXLAN ``device`` or straight
    out of the underlay device ``parent``: removals first (a peer moved to another underlay
    address, or from one way to the other, is removed, then added)."""
    todo = MeshChanges([], [], [], [])
    for worker_id, peer in _differing(now, wanted):
        if peer.direct:
            todo.remove_ip.append(f"route del {peer.prefix} via {peer.next_hop} dev {parent}")
            continue
        mac, gateway = mac_of(worker_id), gateway_of(worker_id)
        todo.remove_ip.extend(
            [
                f"route del {peer.prefix} via {gateway} dev {device}",
                f"neigh del {gateway} dev {device}",
            ]
        )
        todo.remove_bridge.append(f"fdb del {mac} dev {device} dst {peer.underlay}")
    for worker_id, peer in _differing(wanted, now):
        if peer.direct:
            todo.add_ip.append(f"route replace {peer.prefix} via {peer.next_hop} dev {parent}")
            continue
        mac, gateway = mac_of(worker_id), gateway_of(worker_id)
        todo.add_bridge.append(f"fdb replace {mac} dev {device} dst {peer.underlay}")
        todo.add_ip.extend(
            [
                f"neigh replace {gateway} lladdr {mac} dev {device} nud permanent",
                f"route replace {peer.prefix} via {gateway} dev {device}",
            ]
        )
    return todo


def _differing(peers: Mapping[str, Peer], other: Mapping[str, Peer]) -> Iterator[tuple[str, Peer]]:
    """The peers of ``peers`` that ``other`` does not hold as they are, by worker id."""
    return ((w, peer) for w, peer in sorted(peers.items()) if other.get(w) != peer)


def _endpoint(address: str) -> str:
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"{host}:{WG_PORT}"


def wireguard_changes(
    device: str, now: Mapping[str, Peer], wanted: Mapping[str, Peer]
) -> MeshChanges:
    """What takes the WireGuard ``device``'s peers from ``now`` to ``wanted`` (peers without
    a key are left out: nothing goes to them in clear)."""
    todo = MeshChanges([], [], [], [])
    keyed = {w: p for w, p in wanted.items() if p.key}
    for worker_id, peer in sorted(now.items()):
        if keyed.get(worker_id) == peer:
            continue
        todo.remove_ip.append(f"route del {peer.prefix} dev {device}")
        if keyed.get(worker_id, Peer("", "")).key != peer.key:
            todo.wg.append(["peer", peer.key, "remove"])
    for worker_id, peer in sorted(keyed.items()):
        if now.get(worker_id) == peer:
            continue
        todo.wg.append(
            [
                "peer",
                peer.key,
                "endpoint",
                _endpoint(peer.underlay),
                "allowed-ips",
                str(peer.prefix),
            ]
        )
        todo.add_ip.append(f"route replace {peer.prefix} dev {device}")
    return todo


def mesh_rules(chain: str, peers: Iterable[Peer], family: int) -> str:
    """``iptables-restore --noflush`` input (``family`` 4 or 6) that makes ``chain`` take
    VXLAN packets from ``peers`` routed over it only (it is jumped to for UDP to
    :data:`VXLAN_PORT`)."""
    sources = sorted(
        p.underlay
        for p in peers
        if not p.direct and ipaddress.ip_address(p.underlay).version == family
    )
    width = 32 if family == 4 else 128
    lines = ["*filter", f":{chain} - [0:0]", f"-F {chain}"]
    lines += [f"-A {chain} -s {source}/{width} -j ACCEPT" for source in sources]
    lines += [f"-A {chain} -j DROP", "COMMIT"]
    return "\n".join(lines) + "\n"
