"""Machines of the private network made ahead of their claim: a warm start for a machine with a
network namespace of its own.

A warm slot (:mod:`souq.drivers.warm`) is a sandbox made before its machine, with nothing of
the machine in it. A machine of the private network has something of its own that its
sandbox is in: its network namespace, holding its address. So its slot is made for a machine
id chosen ahead (:func:`souq.ids.new_machine_id`), on its network:

1. after a machine of network N and image I starts (or is re-adopted), unless N and I have a
   slot made or being made (at most :data:`_MOST` in all), a machine id is chosen and its
   address taken from the worker's pool (:class:`~souq.network.addresses.AddressPool`, held
   for that id as a machine's is: no machine gets it meanwhile);
2. the driver makes the slot in its maker's thread (:meth:`MakesAhead.keep_ahead`): first the
   namespace, its links, routes, rules and DNAT (:meth:`WorkerNetwork.ensure`), then the
   sandbox, which joins it;
3. a claim of a machine of N and I that is started at once takes the slot if it is ready
   (:meth:`NetworkSlots.take`): its machine gets the slot's id, and with it the address held
   for it (the pool gives an id its own again) and the namespace, which the spawn finds made
   whole. Nothing of the network is left to do at the claim but its edge ports (if the
   worker has an edge host), made at the spawn as for any machine; the fast path's entry is
   added once it runs (:meth:`WorkerNetwork.started`).

A slot is no machine: it has no record, so no name (the names are the records',
:mod:`souq.network.names`), no Flycast or edge rule reaches it, and the proxy knows nothing of
it. Its firewall rules are a machine's (from its own address to its network and the outside;
into it from its network): harmless while it runs the stub, which sends nothing and listens
on nothing, so that what reaches its address is refused by its kernel.

What is given up: a slot whose making failed, at the next claim that would take it; one whose
claim fails before its record is written (:meth:`NetworkSlots.unused`); every one when the
agent leaves (:meth:`NetworkSlots.close`, before the namespaces of machines that do not run
are removed: theirs with them). An agent killed leaves its slots' namespaces and sandboxes:
the sandboxes end with the agent (their waiter's pipe), and the next agent's start removes the
namespaces no machine's record names (:meth:`WorkerNetwork.start`), whose addresses no record
holds either.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from souq.drivers.base import Driver, MachineSpec, makes_ahead
from souq.ids import new_machine_id

if TYPE_CHECKING:
    from souq.network.addresses import AddressPool, PrivateAddress
    from souq.network.links import WorkerNetwork

__all__ = ["NetworkSlots"]

log = logging.getLogger(__name__)

_MOST = 4  # slots made ahead at once (a namespace, a sandbox and an address each)


@dataclass(frozen=True)
class _Ahead:
    machine_id: str
    address: PrivateAddress


class NetworkSlots:
    """The slots made ahead for machines of the private network of one worker."""

    def __init__(self, driver: Driver, network: WorkerNetwork, addresses: AddressPool) -> None:
        self._driver = driver
        self._network = network
        self._addresses = addresses
        self._ahead: dict[tuple[str, str], _Ahead] = {}  # by (network, image reference)
        self._taken: dict[str, _Ahead] = {}  # taken by a claim not yet spawned: by machine id
        self.made = 0  # slots asked of the driver (tests)

    def keep(self, spec: MachineSpec, network: str, image: str) -> None:
        """A machine of ``network`` and ``image`` started from ``spec``: the next one's slot
        made ahead, unless there is one."""
        driver = self._driver
        if not makes_ahead(driver) or (network, image) in self._ahead or len(self._ahead) >= _MOST:
            return
        machine_id = new_machine_id()
        try:
            address = self._addresses.take(machine_id, network)
        except ValueError:  # the worker has no address left: no slot
            return
        netns = self._network.netns_path(machine_id, address)
        ahead = replace(
            spec,
            machine_id=machine_id,
            env={},
            netns=str(netns),
            resolv_conf=str(self._network.resolv_conf),
        )

        def prepare() -> None:
            self._network.ensure(machine_id, address)

        if not driver.keep_ahead(ahead, prepare):
            self._addresses.give_back(machine_id)
            return
        self._ahead[network, image] = _Ahead(machine_id, address)
        self.made += 1

    def take(self, network: str, image: str | None) -> str | None:
        """The machine id of the ready slot of ``network`` and ``image`` (None: there is none
        ready: the claim chooses an id of its own and its machine starts cold)."""
        if image is None or not makes_ahead(self._driver):
            return None
        ahead = self._ahead.get((network, image))
        if ahead is None:
            return None
        state = self._driver.ahead_state(ahead.machine_id)
        if state == "making":
            return None
        del self._ahead[network, image]
        if state != "ready":  # its making failed: what it left, removed
            self._give_up(ahead)
            return None
        self._taken[ahead.machine_id] = ahead
        return ahead.machine_id

    def spawning(self, machine_id: str) -> None:
        """The machine of a slot taken is spawned: the slot is its own from here."""
        self._taken.pop(machine_id, None)

    def unused(self, machine_id: str) -> None:
        """A slot's claim failed before its machine was recorded (or it is destroyed before
        its spawn): the slot and its namespace given up."""
        ahead = self._taken.pop(machine_id, None)
        if ahead is not None and makes_ahead(self._driver):
            self._driver.give_up_ahead(machine_id)
            self._give_up(ahead)

    def _give_up(self, ahead: _Ahead) -> None:
        with contextlib.suppress(OSError):
            self._network.remove(ahead.machine_id, ahead.address)
        self._addresses.give_back(ahead.machine_id)

    def close(self) -> None:
        """Every slot ended, and its namespace removed (the agent leaves)."""
        if makes_ahead(self._driver):
            self._driver.end_ahead()
        for ahead in self._ahead.values():
            self._give_up(ahead)
        self._ahead.clear()
        self._taken.clear()  # theirs now: their machines' records hold the addresses
