"""Private addresses: where a machine is on the cluster's network, decided with no
coordination between workers.

The cluster's prefix is the ULA ``fdaa::/16`` (Fly's). An address is laid out as::

    fdaa : WWWW:WWWW : NNNN:NNNN : MMMM:MMMM:MMMM
    16     32 worker   32 network  48 machine

* **worker** — a hash of the worker's id: each worker owns a /48, so that routing between
  workers (later) is one route per worker, and a worker gives addresses on its own;
* **network** — a hash of the app's network name: its own ``network`` (given at app create,
  Fly's field), else its organization's slug. Machines of one network share these bits on
  every worker: the firewall matches them with a non-contiguous mask
  (:func:`network_mask`);
* **machine** — a hash of the machine's id; on the rare collision with a live machine of the
  worker, the next free value (:class:`AddressPool`), recorded with the machine, so the
  address never changes after its claim.

Each machine also gets an IPv4 link address (:data:`V4_RANGE`, the shared address space of
RFC 6598) so that a program listening on ``0.0.0.0`` is reached by the worker's proxy: the
same hash-then-next-free allocation over the worker's /20 of it (:func:`v4_block`), which
is never routed beyond the worker.

Well-known addresses: :data:`DNS_ADDRESS` (``fdaa::3``) is the worker's DNS server, seen from
every machine; :data:`PROXY_ADDRESS` (``fdaa::4``) is where the host's edge proxy takes the
connections of the worker's machines to Flycast addresses; :data:`GATEWAY6` and
:data:`GATEWAY4` are the host side of every machine's link.

**Flycast** (Fly's name): each app has one more address on its network, answered by the edge
proxy, which starts a stopped machine of the app (``autostart``) and pipes the connection to
it. It is laid out as a machine's, with the worker bits 0 (no worker's: a worker's bits are
never 0) and an app's hash in the machine bits (:func:`flycast_ip`), so one rule per machine
(:func:`flycast_mask`) sends its own network's Flycast connections to the proxy, and the
proxy tells the app from the address alone.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from souq.model.services import MachineAddress

__all__ = [
    "CLUSTER_PREFIX",
    "DNS_ADDRESS",
    "DNS_PORT",
    "FLYCAST_PORT",
    "GATEWAY4",
    "GATEWAY6",
    "PROXY_ADDRESS",
    "UNKNOWN_NETWORK",
    "V4_RANGE",
    "AddressPool",
    "PrivateAddress",
    "app_bits",
    "edge_host",
    "flycast_ip",
    "flycast_mask",
    "machine_bits",
    "network_bits",
    "network_bits_of",
    "network_mask",
    "network_of",
    "private_address",
    "private_ip",
    "v4_block",
    "worker_bits",
]

CLUSTER_PREFIX = ipaddress.IPv6Network("fdaa::/16")
# A claim's network when its broker could not read the app's record (JetStream unavailable):
# a worker without a private network takes the machine; one with it refuses it, never guessing.
UNKNOWN_NETWORK = "?"  # (its refusal: souq.model.reasons.Reason.NETWORK_UNKNOWN)
DNS_ADDRESS = "fdaa::3"  # the worker's DNS server: one address on every worker
DNS_PORT = 53  # what machines ask there (a cluster's name server may listen on another port)
PROXY_ADDRESS = "fdaa::4"  # the host's edge proxy, for the machines' Flycast connections
FLYCAST_PORT = 4282  # its port there (souq proxy --flycast, souq agent --flycast-port)
GATEWAY6 = "fe80::1"  # the host side of every machine's link
GATEWAY4 = "169.254.0.1"  # likewise for IPv4 (link-local: never routed)
V4_RANGE = ipaddress.IPv4Network("100.64.0.0/10")  # RFC 6598 shared space, split per worker
V4_BLOCK_BITS = 20  # each worker's part of V4_RANGE: 4094 machines

_MACHINE_BITS = 48
_MACHINE_SPACE = 1 << _MACHINE_BITS
_PREFIX = int(CLUSTER_PREFIX.network_address)


def _hash(text: str, bits: int) -> int:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << bits) - 1)


def worker_bits(worker_id: str) -> int:
    """A worker's 32 bits (never 0: worker 0 holds the well-known addresses)."""
    return _hash("worker:" + worker_id, 32) or 1


def network_of(org_slug: str, network: str = "") -> str:
    """The network an app's machines are on: its organization's, or, when the app asked for
    one of its own (Fly's ``network`` on app create), that one within its organization: two
    organizations that name a network alike are two networks."""
    org = "org:" + (org_slug or "personal")
    return f"{org}/{network}" if network else org


def network_bits(name: str) -> int:
    """A network's 32 bits (never 0)."""
    return _hash("network:" + name, 32) or 1


def machine_bits(machine_id: str) -> int:
    """A machine's first-choice 48 bits (never 0)."""
    return _hash("machine:" + machine_id, _MACHINE_BITS) or 1


def private_ip(worker: int, network: int, machine: int) -> str:
    """The address of those parts, as text (compressed)."""
    value = _PREFIX | worker << 80 | network << 48 | machine
    return str(ipaddress.IPv6Address(value))


def network_mask(network: int) -> str:
    """``address/mask`` for ip6tables matching every address of ``network`` in the cluster,
    on any worker (the mask is not contiguous: prefix and network bits only)."""
    value = _PREFIX | network << 48
    mask = (0xFFFF << 112) | (0xFFFFFFFF << 48)
    return f"{ipaddress.IPv6Address(value)}/{ipaddress.IPv6Address(mask)}"


def app_bits(app: str) -> int:
    """An app's 48 bits in its Flycast address (never 0)."""
    return _hash("app:" + app, _MACHINE_BITS) or 1


def flycast_ip(network: str, app: str) -> str:
    """The app's Flycast address on its network: worker bits 0, the network's, the app's."""
    return private_ip(0, network_bits(network), app_bits(app))


def flycast_mask(network: str) -> str:
    """``address/mask`` for ip6tables matching every Flycast address of ``network``."""
    value = _PREFIX | network_bits(network) << 48
    mask = (0xFFFF_FFFF_FFFF_FFFF_FFFF << 48) & ((1 << 128) - 1)
    return f"{ipaddress.IPv6Address(value)}/{ipaddress.IPv6Address(mask)}"


def network_bits_of(ip6: str) -> int | None:
    """The network bits of an address of the cluster (None: not in :data:`CLUSTER_PREFIX`)."""
    try:
        address = ipaddress.IPv6Address(ip6)
    except ValueError:
        return None
    if address not in CLUSTER_PREFIX:
        return None
    return int(address) >> 48 & 0xFFFFFFFF


def v4_block(worker_id: str) -> ipaddress.IPv4Network:
    """The worker's /20 of :data:`V4_RANGE` (from a hash of its id)."""
    count = 1 << (V4_BLOCK_BITS - V4_RANGE.prefixlen)
    index = _hash("v4:" + worker_id, 32) % count
    return list(V4_RANGE.subnets(new_prefix=V4_BLOCK_BITS))[index]


def edge_host(advertise: str) -> str:
    """Where a proxy of another host reaches a worker's machines: its advertise address when
    that is an IPv4 address of the host's network (not loopback, not unspecified), forwarded
    to the machines' link addresses; else nowhere ("")."""
    try:
        address = ipaddress.ip_address(advertise)
    except ValueError:
        return ""
    if address.version != 4 or address.is_loopback or address.is_unspecified:
        return ""
    return str(address)


@dataclass(frozen=True)
class PrivateAddress:
    """A machine's place on the private network, as recorded with it; ``edge``: the host
    ports its worker forwards to it, ``(host port, internal port)`` each."""

    ip6: str
    ip4: str
    network: str
    edge: tuple[tuple[int, int], ...] = ()

    @property
    def machine(self) -> int:
        """Its 48 machine bits."""
        return int(ipaddress.IPv6Address(self.ip6)) & (_MACHINE_SPACE - 1)


def private_address(address: MachineAddress) -> PrivateAddress:
    """The private part of a machine's recorded address."""
    edge = tuple(sorted((outer, inner) for inner, outer in address.edge_ports.items()))
    return PrivateAddress(
        ip6=address.private_ip, ip4=address.ip4, network=address.network, edge=edge
    )


class _Values:
    """Values of a space (1..size-1) owned by machines: a hash's value, else the next free."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._owner: dict[int, str] = {}

    def take(self, machine_id: str, first: int) -> int | None:
        value = first % self.size or 1
        for _ in range(self.size):
            owner = self._owner.get(value)
            if owner is None or owner == machine_id:
                self._owner[value] = machine_id
                return value
            value = value + 1 if value + 1 < self.size else 1
        return None

    def hold(self, machine_id: str, value: int) -> None:
        self._owner[value] = machine_id

    def release(self, machine_id: str, value: int) -> None:
        if self._owner.get(value) == machine_id:
            del self._owner[value]


class AddressPool:
    """A worker's private addresses: each live machine's, restored from the records at start
    and taken at claims (in the same step as the machine's row), so that no two machines of
    the worker ever hold one address or one IPv4 link address."""

    def __init__(
        self,
        worker_id: str,
        *,
        v4: ipaddress.IPv4Network | None = None,
        machine_hash: Callable[[str], int] = machine_bits,
    ) -> None:
        self.worker = worker_bits(worker_id)
        self.v4 = v4 or v4_block(worker_id)
        self._hash = machine_hash
        self._machines = _Values(_MACHINE_SPACE)
        # Host numbers of the v4 block; 0 and the broadcast are never given.
        self._v4 = _Values(self.v4.num_addresses - 1)
        self._held: dict[str, PrivateAddress] = {}

    def restore(self, machine_id: str, address: PrivateAddress) -> None:
        """A machine recorded before: its addresses stay its own."""
        self._machines.hold(machine_id, address.machine)
        self._v4.hold(machine_id, self._v4_index(address.ip4))
        self._held[machine_id] = address

    def take(self, machine_id: str, network: str) -> PrivateAddress:
        """The machine's addresses on ``network`` (its own again if it holds some)."""
        held = self._held.get(machine_id)
        if held is not None and held.network == network:
            return held
        if held is not None:
            self.give_back(machine_id)
        first = self._hash(machine_id)
        machine = self._machines.take(machine_id, first)
        index = self._v4.take(machine_id, first)
        if machine is None or index is None:  # 2**48 machines, or 4094 on one worker
            if machine is not None:
                self._machines.release(machine_id, machine)
            raise ValueError("the worker has no private address left")
        address = PrivateAddress(
            ip6=private_ip(self.worker, network_bits(network), machine),
            ip4=str(self.v4.network_address + index),
            network=network,
        )
        self._held[machine_id] = address
        return address

    def give_back(self, machine_id: str) -> None:
        """The machine is destroyed: its addresses are free."""
        held = self._held.pop(machine_id, None)
        if held is not None:
            self._machines.release(machine_id, held.machine)
            self._v4.release(machine_id, self._v4_index(held.ip4))

    def held(self) -> Iterable[tuple[str, PrivateAddress]]:
        return self._held.items()

    def _v4_index(self, ip4: str) -> int:
        return int(ipaddress.IPv4Address(ip4)) - int(self.v4.network_address)
