"""The private network's fast path between workers: a packet between two machines of one
network on two workers is passed from device to device as it comes in (nftables' ``netdev``
family, its ``fwd`` statement), without the worker's routing and firewall, which judge all
other traffic (:mod:`souq.network.links`, :mod:`souq.network.overlay`).

Without it, each such packet crosses its host's IP stack twice, once per worker: the receive
path, the nat and filter chains (``SOUQ-<tag>-FWD`` on the sending side, ``SOUQ-<tag>-TO`` on
the receiving one), the route lookup and the forwarding; across two hosts that made a one-byte
round trip 1.35x the floor's (docs/benchmarks.md). What the fast path checks is what those
chains accept between machines of one network, as stateless matches, so it lets through
nothing they would drop:

* **out of a machine** (a base chain on the ingress of its link ``sx<tag>m<n>``): from its own
  address, to an address of its own network (the non-contiguous mask of
  :func:`~souq.network.addresses.network_mask`), not UDP to the VXLAN port, in the /48 of a
  worker routed to: sent to that worker's next hop on the device of its route (``fwd ip6 to
  <next hop> device <device>``: the host's neighbour entry gives the link-layer header), when
  it fits that device's MTU; bigger ones (and a device of a smaller MTU than the machine's
  link, VXLAN's) take the kernel's route, which answers "packet too big";
* **into a machine** (a base chain on the ingress of the underlay device and of the VXLAN
  device): to one of the worker's machines (a verdict map, address → its chain), from an
  address of that machine's network: sent to its link.

Everything else goes on to the kernel's routing and the worker's chains: the DNS, Flycast, the
worker itself, the outside, machines of the same worker (already as fast as the floor there),
other networks (dropped there). No connection state is kept: the fast path forwards each
packet on what it says, as the chains it stands for accept them. Over WireGuard there is no
fast path (the tunnel is the cost there).

One table per worker, ``netdev souq-<tag>``: made whole at the agent's start
(:meth:`FastPath.start`, in one transaction, so traffic never sees it half made), a machine's
two chains and its map element added once it has started (:meth:`FastPath.add_later`, in a
thread of the fast path's own: ``nft -f`` reads the whole ruleset, 12-13 ms, which a start
need not wait for, since the kernel's routes and the worker's chains carry the machine's
traffic meanwhile) and removed at its destroy, the
peers' maps replaced as the routes change (:meth:`FastPath.route`). A host whose kernel or
``nft`` lacks any of it (``CONFIG_NF_TABLES_NETDEV``, ``CONFIG_NFT_FWD_NETDEV``) keeps the
kernel's path alone, said once in the agent's log. The ``fwd`` rules count what they pass
(``nft list table netdev souq-<tag>``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import shutil
import subprocess
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from souq.network.addresses import network_bits, network_mask
from souq.network.mesh import VXLAN_PORT, Peer, gateway_of

__all__ = [
    "LINK_MTU",
    "FastPath",
    "Hop",
    "MachineLink",
    "hops_of",
    "machine_removal",
    "machine_script",
    "route_script",
    "table_script",
]

log = logging.getLogger(__name__)

LINK_MTU = 1500  # a machine link's (the veth default): what a machine sends at most


@dataclass(frozen=True)
class MachineLink:
    """One machine of the worker, as the fast path sees it: its link and its address."""

    link: str
    ip6: str
    network: str  # the name of its network (souq.network.addresses.network_of)


@dataclass(frozen=True)
class Hop:
    """A device the routes to other workers go out of, its MTU, and per routed /48 the next
    hop on it."""

    device: str
    mtu: int
    next_hops: Mapping[str, str]  # "fdaa:w:w::/48" -> next hop address


def _network_match(network: str) -> str:
    address, mask = network_mask(network_bits(network)).split("/")
    return f"& {mask} == {address}"


def _machine_lines(table: str, m: MachineLink) -> list[str]:
    """A machine's two chains and its element of the machines' map."""
    match = _network_match(m.network)
    return [
        f"add chain netdev {table} out-{m.link} "
        f'{{ type filter hook ingress device "{m.link}" priority 0; }}',
        f"add rule netdev {table} out-{m.link} ip6 saddr {m.ip6} ip6 daddr {match} goto peers",
        f"add chain netdev {table} in-{m.link}",
        f"add rule netdev {table} in-{m.link} ip6 saddr {match} counter "
        f'fwd ip6 to {m.ip6} device "{m.link}"',
        f"add element netdev {table} machines {{ {m.ip6} : goto in-{m.link} }}",
    ]


def machine_script(tag: str, m: MachineLink) -> str:
    """The ``nft -f`` text that adds a machine to the worker's table."""
    return "\n".join(_machine_lines(f"souq-{tag}", m)) + "\n"


def machine_removal(tag: str, m: MachineLink) -> str:
    """The ``nft -f`` text that takes it out again."""
    table = f"souq-{tag}"
    return (
        f"delete element netdev {table} machines {{ {m.ip6} }}\n"
        f"delete chain netdev {table} out-{m.link}\n"
        f"delete chain netdev {table} in-{m.link}\n"
    )


def _hop_lines(table: str, hops: list[Hop], gone: Iterable[str] = ()) -> list[str]:
    """The peers' chain, a map of next hops per device of ``hops``, and the chains of what
    comes in on those devices; those of the devices ``gone`` removed."""
    lines = [f"add chain netdev {table} peers", f"flush chain netdev {table} peers"]
    for device in sorted(set(gone) - {h.device for h in hops}):  # the chain no longer uses it
        lines += [
            f"delete chain netdev {table} from-{device}",
            f"delete map netdev {table} to-{device}",
        ]
    lines.append(f"add rule netdev {table} peers udp dport {VXLAN_PORT} return")
    for hop in hops:
        name = f"to-{hop.device}"
        lines += [
            f"add map netdev {table} {name} {{ type ipv6_addr : ipv6_addr; flags interval; }}",
            f"flush map netdev {table} {name}",
        ]
        if hop.next_hops:
            elements = ", ".join(f"{p} : {n}" for p, n in sorted(hop.next_hops.items()))
            lines.append(f"add element netdev {table} {name} {{ {elements} }}")
        fits = f"meta length <= {hop.mtu} " if hop.mtu < LINK_MTU else ""
        lines.append(
            f"add rule netdev {table} peers {fits}counter "
            f'fwd ip6 to ip6 daddr map @{name} device "{hop.device}"'
        )
    for hop in hops:  # what comes in from other workers
        lines += [
            f"add chain netdev {table} from-{hop.device} "
            f'{{ type filter hook ingress device "{hop.device}" priority 0; }}',
            f"flush chain netdev {table} from-{hop.device}",
            f"add rule netdev {table} from-{hop.device} ip6 daddr vmap @machines",
        ]
    return lines


def table_script(tag: str, machines: Iterable[MachineLink], hops: Iterable[Hop] = ()) -> str:
    """The ``nft -f`` text that makes the worker's table anew, whole, in one transaction."""
    table = f"souq-{tag}"
    lines = [
        f"table netdev {table} {{}}",  # so that the deletion finds it on the first start
        f"delete table netdev {table}",
        f"add table netdev {table}",
        f"add map netdev {table} machines {{ type ipv6_addr : verdict; }}",
        *_hop_lines(table, list(hops)),
    ]
    for m in machines:
        lines += _machine_lines(table, m)
    return "\n".join(lines) + "\n"


def route_script(tag: str, hops: Iterable[Hop], before: Iterable[str] = ()) -> str:
    """The ``nft -f`` text that sets the peers' chain, maps and incoming chains to ``hops``;
    ``before``: the devices routed to until now (those no longer among ``hops`` lose their
    map and chain)."""
    return "\n".join(_hop_lines(f"souq-{tag}", list(hops), before)) + "\n"


def hops_of(
    peers: Mapping[str, Peer], parent: str, parent_mtu: int, vxlan: str, vxlan_mtu: int
) -> list[Hop]:
    """The devices and next hops of ``peers`` (straight: the underlay device and the peer's
    address, or its link-local address there; else the VXLAN device and the peer's
    link-local address on it)."""
    straight = {str(p.prefix): p.next_hop for p in peers.values() if p.direct}
    over = {str(p.prefix): gateway_of(w) for w, p in peers.items() if not p.direct}
    hops = [Hop(parent, parent_mtu, straight)] if parent else []
    if vxlan:
        hops.append(Hop(vxlan, vxlan_mtu, over))
    return hops


def _nft(script: str) -> None:
    done = subprocess.run(
        ["nft", "-f", "-"], input=script, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise OSError(f"nft: {done.stderr.strip() or done.returncode}")


class FastPath:
    """The worker's table (:func:`table_script`) kept as its machines and routes change. Off
    (``why_not`` says why) where the host cannot make it; then every call does nothing.

    A machine's entry is added in a thread of its own (:meth:`add_later`); every change to
    the table holds one lock, and a machine removed before its entry was added gets none (what
    is wanted is noted first, and the thread adds only what is still wanted)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.why_not: str | None = None if shutil.which("nft") else "nft not installed"
        self._machines: dict[str, MachineLink] = {}  # by link
        self._wanted: dict[str, MachineLink] = {}  # by link: added by the thread unless removed
        self._hops: list[Hop] = []
        self._lock = threading.Lock()
        self._adder: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def on(self) -> bool:
        return self.why_not is None

    def start(self, machines: Iterable[MachineLink]) -> None:
        """The table anew for ``machines`` (those whose link is there), no routes yet."""
        if not self.on:
            log.info("private network: no fast path between workers (%s)", self.why_not)
            return
        with self._lock:
            self._machines = {m.link: m for m in machines}
            self._wanted = dict(self._machines)
            self._hops = []
            try:
                _nft(table_script(self.tag, self._machines.values()))
            except OSError as exc:
                self.why_not = str(exc)
                self._machines = {}
                log.warning(
                    "private network: no fast path between workers, the kernel's routes alone: %s",
                    exc,
                )

    def add_later(self, m: MachineLink) -> concurrent.futures.Future[None] | None:
        """A machine that has started: :meth:`add` in the fast path's thread (None: nothing
        to do, it is in the table as it is, or there is no fast path)."""
        if not self.on or self._machines.get(m.link) == m:
            return None
        self._wanted[m.link] = m
        if self._adder is None:
            self._adder = concurrent.futures.ThreadPoolExecutor(1, f"souq-fast-{self.tag}")
        return self._adder.submit(self._add_wanted, m)

    def _add_wanted(self, m: MachineLink) -> None:
        with self._lock:
            if self._wanted.get(m.link) == m:  # not removed meanwhile
                self._add(m)

    def add(self, m: MachineLink) -> None:
        """A machine whose link is there: in the table unless it is already, as it is."""
        if not self.on:
            return
        with self._lock:
            self._wanted[m.link] = m
            self._add(m)

    def _add(self, m: MachineLink) -> None:
        if self._machines.get(m.link) == m:
            return
        if m.link in self._machines:
            self._remove(self._machines[m.link])
        try:
            _nft(machine_script(self.tag, m))
        except OSError as exc:  # it goes the kernel's way: slower, as safe
            log.warning("private network: no fast path for %s: %s", m.link, exc)
            return
        self._machines[m.link] = m

    def remove(self, m: MachineLink) -> None:
        if not self.on:
            return
        with self._lock:
            self._wanted.pop(m.link, None)
            self._remove(m)

    def _remove(self, m: MachineLink) -> None:
        made = self._machines.pop(m.link, None)
        if made is None:
            return
        m = made
        try:
            _nft(machine_removal(self.tag, m))
        except OSError as exc:  # the table is made anew at the next start
            log.warning("private network: the fast path of %s: %s", m.link, exc)

    def route(self, hops: list[Hop]) -> None:
        """The routes to other workers now ``hops``."""
        if not self.on or hops == self._hops:
            return
        with self._lock:
            before = [h.device for h in self._hops]
            try:
                _nft(route_script(self.tag, hops, before))
            except OSError as exc:
                log.warning("private network: the fast path's routes: %s", exc)
                return
            self._hops = list(hops)

    def settled(self, timeout: float | None = None) -> None:
        """Wait for the entries asked for so far to be added (tests, benchmarks, close)."""
        with self._lock:
            adder = self._adder
        if adder is not None:
            adder.submit(lambda: None).result(timeout)

    def close(self) -> None:
        """The thread ended, once what it was asked is done."""
        adder, self._adder = self._adder, None
        if adder is not None:
            adder.shutdown(wait=True)

    def stop(self) -> None:
        """The table gone (tests, benchmarks; an agent keeps it for its machines)."""
        self.close()
        if self.on:
            subprocess.run(
                ["nft", "delete", "table", "netdev", f"souq-{self.tag}"],
                capture_output=True,
                check=False,
            )
        self._machines, self._wanted, self._hops = {}, {}, []
