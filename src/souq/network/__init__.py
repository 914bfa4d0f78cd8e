"""The private network (6PN): every machine's own address on its network, and the rules that
keep one network from another. :mod:`~souq.network.addresses` is pure (the layout, the
allocation); :mod:`~souq.network.netns` makes and removes a machine's network namespace and
:mod:`~souq.network.firewall` the worker's rules (root, ``ip``, ``ip6tables``)."""

from souq.network.addresses import (
    CLUSTER_PREFIX,
    DNS_ADDRESS,
    AddressPool,
    network_bits,
    network_of,
    private_ip,
    worker_bits,
)

__all__ = [
    "CLUSTER_PREFIX",
    "DNS_ADDRESS",
    "AddressPool",
    "network_bits",
    "network_of",
    "private_ip",
    "worker_bits",
]
