"""The private network of machines (6PN). Addresses: :mod:`~souq.network.addresses` is pure
(the layout, the allocation); :mod:`~souq.network.links` makes and removes a machine's network
namespace and the worker's rules (root, ``ip``, ``ip6tables``); :mod:`~souq.network.mesh`
(pure) and :mod:`~souq.network.overlay` the routes between workers,
:mod:`~souq.network.link_probes` the probes of the paths straight over an IPv4 link (``ping``),
and :mod:`~souq.network.fastpath` their fast path (``nft``); see docs/network.md.
Names: :mod:`~souq.network.names` (what each ``.internal`` name answers, pure),
:mod:`~souq.network.name_feed` (from the cluster view to the name index),
:mod:`~souq.network.dns_server` (the DNS server; its UDP socket read by
:mod:`~souq.network.dns_udp`) and :mod:`~souq.network.name_service` (the three on one worker);
see docs/names.md."""

from souq.network.addresses import (
    CLUSTER_PREFIX,
    DNS_ADDRESS,
    AddressPool,
    network_bits,
    network_of,
    private_ip,
    worker_bits,
)
from souq.network.names import Answer, NameIndex, NameRow, Rcode, Scope

__all__ = [
    "CLUSTER_PREFIX",
    "DNS_ADDRESS",
    "AddressPool",
    "Answer",
    "NameIndex",
    "NameRow",
    "Rcode",
    "Scope",
    "network_bits",
    "network_of",
    "private_ip",
    "worker_bits",
]
