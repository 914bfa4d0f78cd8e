"""The agent's share of the private network (souq.network): whether its machines get one,
the routes to other workers' machines, and what it leaves behind when it goes away."""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING

from souq.agent.config import AgentConfig
from souq.agent.machines.executor import Executor
from souq.drivers import sandbox
from souq.errors import InvalidInput
from souq.network import links
from souq.network.addresses import private_address
from souq.network.overlay import Overlay
from souq.network.wireguard import WireGuard

if TYPE_CHECKING:
    from souq.drivers.host import HostDriver

__all__ = ["leave", "start_overlay", "underlay", "why_not"]

log = logging.getLogger(__name__)


def why_not(asked: str, host: HostDriver | None) -> str | None:
    """Why machines here get no private network (None: they do), for ``--private-network``
    ``asked``; ``on`` and a host that cannot: refused."""
    if asked == "off":
        return "the private network is off on this worker (--private-network)"
    why = links.unavailable()
    if why is None and host is not None and not host.sandbox:
        why = "the sandbox driver is unavailable here: " + (sandbox.unavailable() or "off")
    if why is None and host is not None and host.exec.waiter is None:
        why = "souq-waiter (built with the host's C compiler) is needed to join namespaces"
    if host is None:
        why = "a hollow worker runs no machines"
    if why is not None and asked == "on":
        raise InvalidInput(f"--private-network on: {why}", hint="use auto, or off")
    return why


def underlay(config: AgentConfig) -> str:
    """Where other workers route this worker's machines' addresses: ``--underlay``, else
    the advertise address unless it is loopback, else nowhere."""
    if config.underlay:
        return config.underlay
    try:
        advertised = ipaddress.ip_address(config.advertise)
    except ValueError:
        return ""
    return "" if advertised.is_loopback or advertised.is_unspecified else str(advertised)


def start_overlay(
    config: AgentConfig, worker_id: str, net: links.WorkerNetwork
) -> Overlay | WireGuard | None:
    """The routes to other workers' machines, started (None: no underlay address, or one
    that cannot carry them and was not asked for by name)."""
    address = underlay(config)
    if not address:
        log.info("private network: no underlay address, so no routes to other workers")
        return None
    overlay: Overlay | WireGuard
    if config.underlay_encryption == "wireguard":
        overlay = WireGuard(worker_id, net.tag, address, config.data_dir / "network")
    else:
        overlay = Overlay(
            worker_id,
            net.tag,
            address,
            fast=net.fast,
            link=config.underlay_link,
        )
    try:
        overlay.start()
    except (OSError, ValueError) as exc:
        if config.underlay or config.underlay_encryption != "none":
            raise InvalidInput(
                f"--underlay {address}: {exc}",
                hint="give an address this host has (and for --underlay-encryption "
                "wireguard: wireguard-tools, and the kernel's WireGuard or wireguard-go)",
            ) from exc
        log.warning("private network: no routes to other workers: %s", exc)
        return None
    return overlay


def leave(executor: Executor, network: links.WorkerNetwork) -> None:
    """What the private network holds for machines that do not run, removed (made again at
    their next start): nothing is left of a worker whose machines are all stopped. Slots made
    ahead of their claims are ended first (souq.agent.machines.network_slots)."""
    if executor.network_slots is not None:
        executor.network_slots.close()
    running = [
        (row.id, private_address(row.address))
        for row in executor.rows()
        if executor.handle(row.id) is not None
        and row.address is not None
        and row.address.private_ip
    ]
    try:
        network.leave(running)
    except OSError as exc:
        log.warning("private network: could not remove what stopped machines hold: %s", exc)
