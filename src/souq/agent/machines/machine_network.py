"""A machine's network on its worker: at its spawn, the namespace its spec joins (made at its
first start, or ahead with a slot, :mod:`souq.agent.machines.network_slots`), its fast path's
entry once it runs, and the slot made ahead for the next machine of its network and image; once
it is gone, its host ports and addresses given back."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from souq.agent.capacity.ports import PortPool
from souq.agent.machines.images import AgentImages, image_of
from souq.agent.machines.launch import machine_spec
from souq.agent.machines.network_slots import NetworkSlots
from souq.agent.state.records import MachineRow
from souq.agent.volumes.worker_volumes import AgentVolumes
from souq.drivers.base import MachineSpec
from souq.network.addresses import AddressPool, PrivateAddress, private_address
from souq.network.links import WorkerNetwork

__all__ = ["Networked", "give_back", "joined", "keep_ahead", "started"]


class Networked(Protocol):
    """What of the executor a machine's network takes."""

    worker_id: str
    ports: PortPool
    addresses: AddressPool | None
    network: WorkerNetwork | None
    network_slots: NetworkSlots | None
    images: AgentImages | None
    volumes: AgentVolumes | None


def joined(
    ex: Networked, row: MachineRow, spec: MachineSpec
) -> tuple[MachineSpec, PrivateAddress | None]:
    """``spec`` in the machine's own network namespace, made unless it is there (raises
    OSError when it cannot be), and its private address; as it was for a machine of none."""
    if ex.network is None or row.address is None or not row.address.private_ip:
        return spec, None
    private = private_address(row.address)
    if ex.network_slots is not None:
        ex.network_slots.spawning(row.id)
    netns = ex.network.ensure(row.id, private)
    joins = replace(spec, netns=str(netns), resolv_conf=str(ex.network.resolv_conf), network=True)
    return joins, private


def started(ex: Networked, row: MachineRow, spec: MachineSpec, private: PrivateAddress) -> None:
    """The machine runs: its fast path's entry (in the background), and a slot ahead."""
    if ex.network is not None:
        ex.network.started(row.id, private)
        keep_ahead(ex, row, spec)


def keep_ahead(ex: Networked, row: MachineRow, spec: MachineSpec | None = None) -> None:
    """A machine of the private network and of an image runs (started, or re-adopted from
    ``spec``, else its record): the next one of its network and image gets a slot made
    ahead (souq.agent.machines.network_slots)."""
    ref = image_of(row.placement)
    if ex.network_slots is None or ref is None or row.address is None:
        return
    if not row.address.private_ip:
        return
    if spec is None:  # re-adopted: its spec as its start made it (the env aside)
        image = None if ex.images is None else ex.images.ready(ref)
        if image is None:
            return
        mounts = ex.volumes.host_mounts(row.config) if ex.volumes is not None else ()
        spec = machine_spec(row, ex.worker_id, image, None, mounts)
    ex.network_slots.keep(spec, row.address.network, ref)


def give_back(ex: Networked, machine_id: str) -> None:
    """The machine's host ports and private addresses are free again."""
    ex.ports.give_back(machine_id)
    if ex.network_slots is not None:
        ex.network_slots.unused(machine_id)
    if ex.addresses is not None:
        ex.addresses.give_back(machine_id)
