"""A machine's network on its worker: at its spawn, the namespace its spec joins (made at its
first start and kept); once it is gone, its host ports and addresses given back."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from souq.agent.capacity.ports import PortPool
from souq.agent.state.records import MachineRow
from souq.drivers.base import MachineSpec
from souq.network.addresses import AddressPool, private_address
from souq.network.links import WorkerNetwork

__all__ = ["Networked", "give_back", "joined"]


class Networked(Protocol):
    """What of the executor a machine's network takes."""

    ports: PortPool
    addresses: AddressPool | None
    network: WorkerNetwork | None


def joined(ex: Networked, row: MachineRow, spec: MachineSpec) -> MachineSpec:
    """``spec`` in the machine's own network namespace, made unless it is there (raises
    OSError when it cannot be); as it was for a machine of none."""
    if ex.network is None or row.address is None or not row.address.private_ip:
        return spec
    netns = ex.network.ensure(row.id, private_address(row.address))
    return replace(spec, netns=str(netns), resolv_conf=str(ex.network.resolv_conf), network=True)


def give_back(ex: Networked, machine_id: str) -> None:
    """The machine's host ports and private addresses are free again."""
    ex.ports.give_back(machine_id)
    if ex.addresses is not None:
        ex.addresses.give_back(machine_id)
