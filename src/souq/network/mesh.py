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
publish their underlay device's IPv6 link-local address (``underlay_link``: ``--underlay-link
auto``, the default, or ``direct``), the other is a *link peer* (:attr:`Peer.link`): its /48
may go straight via that address, if the segment carries the IPv6 frames as it carries the
IPv4 ones. ``direct`` says it does; ``auto`` routes straight only once a probe proved it
(:func:`over_link`): an ICMPv6 echo from this worker's :func:`probe_address` to the peer's,
through a route of that one address via the peer's link-local (:func:`probe_command`), so a
packet from this worker's /48 to the other's, on the very path its machines' packets would
take, was answered; no answer, and it keeps VXLAN, said in the log. The probes are repeated
(:func:`due_at`): at once when the peer is heard anew, then every :data:`PROBE_INTERVAL_S`
while they are answered (a direct path that stops answering falls back to VXLAN), further
apart while they are not. Elsewhere the hosts' network may not carry the cluster's ULA prefix
(an IPv4-only underlay: the kernel routes no IPv6 via an IPv4 next hop; a provider's router),
so the route goes over a VXLAN device per worker (the kernel's; UDP :data:`VXLAN_PORT` between
the hosts' underlay addresses, no learning, no flooding):

* the device's MAC and link-local address are the worker's (:func:`mac_of`, :func:`gateway_of`:
  its 32 worker bits), so another worker's entry for it is known from its id alone;
* per other worker: a permanent neighbour (its link-local → its MAC), a forwarding entry (its
  MAC → its underlay address) and the route of its /48 via its link-local address. A link
  peer keeps those entries whichever way its /48 goes (so that going from one way to the other
  is one ``route replace``), and the route of its probe address via its link-local.

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from souq.network.addresses import CLUSTER_PREFIX, worker_bits

__all__ = [
    "PROBE_BACKOFF_MAX_S",
    "PROBE_DEADLINE_S",
    "PROBE_INTERVAL_S",
    "VNI",
    "VXLAN_OVERHEAD",
    "VXLAN_PORT",
    "WG_PORT",
    "LinkProbe",
    "MeshChanges",
    "Peer",
    "UnderlayLink",
    "changes",
    "due_at",
    "gateway_of",
    "mac_of",
    "mesh_rules",
    "next_probe_at",
    "over_link",
    "peers_of",
    "probe_address",
    "probe_command",
    "probes_due",
    "wireguard_changes",
    "worker_prefix",
]

VXLAN_PORT = 4789  # IANA's
VNI = 0x6AA  # the cluster network's VXLAN id: one for every worker
VXLAN_OVERHEAD = 50  # bytes a VXLAN frame adds over IPv4 (70 over IPv6)
WG_PORT = 51820  # WireGuard's usual port: every worker's
WG_OVERHEAD = 60  # bytes WireGuard adds over IPv4 (80 over IPv6)
_PREFIX = int(CLUSTER_PREFIX.network_address)

UnderlayLink = Literal["auto", "vxlan", "direct"]  # agent --underlay-link
PROBE_INTERVAL_S = 15.0  # a link peer's path probed again this often while it answers
PROBE_BACKOFF_MAX_S = 300.0  # and at most this far apart while it does not
PROBE_DEADLINE_S = 2.0  # one probe: echoes every 0.2 s until one is answered, or this long


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


def probe_address(worker_id: str) -> str:
    """The address in the worker's /48 that its host holds to answer the probes of link peers
    (network bits 0: no machine's, every network's bits being other than 0)."""
    return str(worker_prefix(worker_id).network_address + 1)


@dataclass(frozen=True)
class Peer:
    """Another worker, as far as the routes go: its id, its host's underlay address, and
    whether its /48 goes straight (``direct``), not over VXLAN."""

    worker_id: str
    underlay: str
    direct: bool = False
    key: str = ""  # its WireGuard public key (empty: it has none)
    # A link peer (on this host's IPv4 link, both publishing one): its underlay device's IPv6
    # link-local address, its /48's next hop when direct, its probe address's always.
    link: str = ""

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
class LinkProbe:
    """What the last probe of a link peer's path said: to which of its link-local addresses
    (one it no longer publishes proves nothing), when (monotonic seconds), whether it was
    answered, how many in a row were not; ``recheck``: the peer was heard anew since, so the
    next probe is due at once (the way it goes kept meanwhile)."""

    link: str
    at: float
    answered: bool
    failures: int = 0
    recheck: bool = False


def over_link(
    peer: Peer,
    link: str,
    *,
    mode: UnderlayLink,
    own_link: str,
    on_link: Callable[[ipaddress.IPv4Address | ipaddress.IPv6Address], bool],
    probe: LinkProbe | None = None,
    unprobed: str = "not probed yet",
) -> tuple[Peer, str]:
    """``peer`` (as :func:`peers_of` made it) given the link-local address it publishes
    (``link``, empty: none), this worker's ``mode``, its own published link-local
    (``own_link``) and the last ``probe`` of that path: a link peer (``link`` set) when both
    publish one and its IPv4 address is on this host's link, its /48 straight when ``direct``
    says so or, under ``auto``, a probe of that very link was answered; and why it goes the
    way it goes (for the log; ``unprobed``: why not, before any probe answered)."""
    why_not = _not_a_link_peer(peer, link, mode, own_link, on_link)
    if why_not is not None:
        return peer, why_not
    candidate = Peer(peer.worker_id, peer.underlay, False, peer.key, link)
    straight = Peer(peer.worker_id, peer.underlay, True, peer.key, link)
    if mode == "direct":
        return straight, "--underlay-link direct"
    if probe is None or probe.link != link:
        return candidate, unprobed
    if probe.answered:
        return straight, "a probe from this worker's prefix to its own over the link was answered"
    return candidate, (
        "a probe from this worker's prefix to its own over the link got no answer: the "
        "segment may not carry IPv6 frames of fdaa::/16 (probed again, further apart)"
    )


def _not_a_link_peer(
    peer: Peer,
    link: str,
    mode: UnderlayLink,
    own_link: str,
    on_link: Callable[[ipaddress.IPv4Address | ipaddress.IPv6Address], bool],
) -> str | None:
    """Why ``peer`` is no link peer (None: it is one), the first reason that holds."""
    address = ipaddress.ip_address(peer.underlay)
    reasons = (
        (peer.direct, "its IPv6 underlay address is on this host's link"),
        (mode == "vxlan", "--underlay-link vxlan"),
        (not own_link, "this host's underlay device has no IPv6 link-local address"),
        (
            address.version != 4 or not on_link(address),
            "its underlay address is not on this host's IPv4 subnet",
        ),
        (not link, "it publishes no link-local address (--underlay-link vxlan)"),
    )
    return next((why for holds, why in reasons if holds), None)


def due_at(
    probe: LinkProbe | None,
    link: str,
    interval_s: float = PROBE_INTERVAL_S,
    backoff_max_s: float = PROBE_BACKOFF_MAX_S,
) -> float:
    """When a link peer publishing ``link`` is to be probed next: at once (0) if it never
    was over that link or was heard anew since; ``interval_s`` after an answered probe;
    after unanswered ones, ``interval_s`` doubled per further failure, at most
    ``backoff_max_s``."""
    if probe is None or probe.link != link or probe.recheck:
        return 0.0
    if probe.answered:
        return probe.at + interval_s
    return probe.at + min(interval_s * (1 << min(max(probe.failures - 1, 0), 16)), backoff_max_s)


def probes_due(
    peers: Mapping[str, Peer],
    probes: Mapping[str, LinkProbe],
    now: float,
    interval_s: float = PROBE_INTERVAL_S,
) -> list[Peer]:
    """The link peers whose path is to be probed at ``now``, by worker id."""
    return [
        p
        for w, p in sorted(peers.items())
        if p.link and due_at(probes.get(w), p.link, interval_s) <= now
    ]


def next_probe_at(
    peers: Mapping[str, Peer],
    probes: Mapping[str, LinkProbe],
    interval_s: float = PROBE_INTERVAL_S,
) -> float | None:
    """When the next probe is due (None: no link peer)."""
    due = [due_at(probes.get(w), p.link, interval_s) for w, p in peers.items() if p.link]
    return min(due) if due else None


def probe_command(source: str, target: str, deadline_s: float = PROBE_DEADLINE_S) -> list[str]:
    """The probe: iputils' ``ping`` from ``source`` (this worker's probe address) to
    ``target`` (the peer's), an echo every 0.2 s until one is answered (exit 0) or
    ``deadline_s`` passed (exit 1). Where it goes is the route of ``target``: over the link."""
    deadline = max(1, round(deadline_s))
    return ["ping", "-6", "-n", "-q", "-c", "1", "-i", "0.2", "-w", str(deadline), "-I", source,
            target]  # fmt: skip


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


# What a peer holds, by what it is: (tool, what) -> (the line that adds it, the one that
# removes it). Of the same key in both sets, the add line alone replaces the old one in place.
_Entries = dict[tuple[str, str], tuple[str, str]]


def _entries(worker_id: str, peer: Peer, device: str, parent: str) -> _Entries:
    """The peer's entries: over VXLAN (and for a link peer, whichever way its /48 goes) its
    forwarding entry and neighbour on ``device``; the route of its /48 (straight out of
    ``parent``, or into ``device``); a link peer's probe address routed via its link-local."""
    held: _Entries = {}
    if not peer.direct or peer.link:
        mac, gateway = mac_of(worker_id), gateway_of(worker_id)
        fdb = f"{mac} dev {device} dst {peer.underlay}"
        held["bridge", "fdb " + fdb] = (f"fdb replace {fdb}", f"fdb del {fdb}")
        held["ip", "neigh"] = (
            f"neigh replace {gateway} lladdr {mac} dev {device} nud permanent",
            f"neigh del {gateway} dev {device}",
        )
    if peer.direct:
        route = f"{peer.prefix} via {peer.next_hop} dev {parent}"
    else:
        route = f"{peer.prefix} via {gateway_of(worker_id)} dev {device}"
    held["ip", "route"] = (f"route replace {route}", f"route del {route}")
    if peer.link:
        probe = f"{probe_address(worker_id)}/128 via {peer.link} dev {parent}"
        held["ip", "probe"] = (f"route replace {probe}", f"route del {probe}")
    return held


def changes(
    device: str, parent: str, now: Mapping[str, Peer], wanted: Mapping[str, Peer]
) -> MeshChanges:
    """What takes the peers from ``now`` to ``wanted``, over the VXLAN ``device`` or straight
    out of the underlay device ``parent``: removals first (a peer moved to another underlay
    address: its old entries removed, then the new ones added), except that a route that
    changes its way is replaced in place (``route replace``: no moment without it)."""
    todo = MeshChanges([], [], [], [])
    for worker_id in sorted(set(now) | set(wanted)):
        old, new = now.get(worker_id), wanted.get(worker_id)
        if old == new:
            continue
        before = _entries(worker_id, old, device, parent) if old else {}
        after = _entries(worker_id, new, device, parent) if new else {}
        for key, (_, remove) in before.items():
            if key not in after:
                (todo.remove_ip if key[0] == "ip" else todo.remove_bridge).append(remove)
        for key, (add, _) in after.items():
            if before.get(key, ("", ""))[0] != add:
                (todo.add_ip if key[0] == "ip" else todo.add_bridge).append(add)
    return todo


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
    VXLAN packets from ``peers`` routed over it and from link peers only (one of those may
    send over VXLAN what this worker sends it straight: each side goes its own proven way; it
    is jumped to for UDP to :data:`VXLAN_PORT`)."""
    sources = sorted(
        p.underlay
        for p in peers
        if (not p.direct or p.link) and ipaddress.ip_address(p.underlay).version == family
    )
    width = 32 if family == 4 else 128
    lines = ["*filter", f":{chain} - [0:0]", f"-F {chain}"]
    lines += [f"-A {chain} -s {source}/{width} -j ACCEPT" for source in sources]
    lines += [f"-A {chain} -j DROP", "COMMIT"]
    return "\n".join(lines) + "\n"
