"""What ``souq dev`` runs for its workers' private network, in its own process: the machines'
``.internal`` names (its agents hold no ``view`` credential to answer them) and a Flycast port,
each of this cluster's own, so that two clusters of one host stay apart (docs/names.md)."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from souq.auth.files import AuthDir
from souq.natsserver import free_port
from souq.network import links
from souq.network.addresses import DNS_ADDRESS

if TYPE_CHECKING:
    from souq.network.name_service import NameService

__all__ = ["HostNetwork", "host_network", "start_names"]


@dataclass
class HostNetwork:
    """What this process runs for its workers' private network: the machines' names and
    Flycast's port (each this cluster's own, so that two clusters of one host stay apart)."""

    names: NameService | None = None
    flycast_port: int = 0  # 0: no Flycast

    async def aclose(self) -> None:
        if self.names is not None:
            await self.names.aclose()
            self.names = None

    def agent_args(self) -> list[str]:
        args = ["--flycast-port", str(self.flycast_port)]
        if self.names is not None:
            args += ["--names-port", str(self.names.address[1])]
        return args


async def host_network(nats_url: str, auth: AuthDir) -> HostNetwork:
    """Where the workers can have the private network: the names (answered by this process)
    and a port of this cluster's own at the workers' proxy address for Flycast, for its agents
    to send to and its proxy to take; elsewhere neither."""
    if links.unavailable() is not None:
        return HostNetwork()
    return HostNetwork(await start_names(nats_url, auth), free_port())


async def start_names(nats_url: str, auth: AuthDir) -> NameService | None:
    """The machines' ``.internal`` names, answered by this process at the address every
    machine's ``resolv.conf`` names (docs/names.md) on a port of this cluster's own (its
    agents send their machines' questions there), from its own replica of the cluster view as
    the bus's read-only ``view`` role: the workers' agents are not given that credential."""
    from souq.network.name_service import NameService, connect_view

    await asyncio.to_thread(links.host_addresses)
    transport = await connect_view(nats_url, auth.path, name="souq-dev-names")
    names = NameService(transport, listen=(DNS_ADDRESS, 0), owns_transport=True)
    try:
        await names.start()
    except OSError as exc:
        await names.aclose()
        print(f"souq dev: the machines get no .internal names: {exc}", file=sys.stderr)
        return None
    return names
