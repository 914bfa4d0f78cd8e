"""The slots made ahead for machines of the private network (souq.agent.machines.network_slots),
with a driver and a network that only record what they are asked: one slot per network and
image, its address held from its making and given back with it, taken only when ready, and
given up (namespace and address) when its making failed, its claim failed, or the agent leaves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from souq.agent.machines.network_slots import NetworkSlots
from souq.drivers.base import MachineSpec
from souq.network.addresses import AddressPool, PrivateAddress


class Network:
    resolv_conf = Path("/run/resolv.conf")

    def __init__(self) -> None:
        self.made: list[str] = []
        self.removed: list[str] = []

    def netns_path(self, machine_id: str, address: PrivateAddress) -> Path:
        return Path("/run/netns") / machine_id

    def ensure(self, machine_id: str, address: PrivateAddress) -> Path:
        self.made.append(machine_id)
        return self.netns_path(machine_id, address)

    def remove(self, machine_id: str, address: PrivateAddress) -> None:
        self.removed.append(machine_id)


class Driver:
    """Makes each slot at once when ``ready`` (else leaves it being made)."""

    def __init__(self) -> None:
        self.specs: dict[str, MachineSpec] = {}
        self.states: dict[str, str] = {}
        self.given_up: list[str] = []
        self.ready = True

    def keep_ahead(self, spec: MachineSpec, prepare: Callable[[], None]) -> bool:
        prepare()
        self.specs[spec.machine_id] = spec
        self.states[spec.machine_id] = "ready" if self.ready else "making"
        return True

    def ahead_state(self, machine_id: str) -> str:
        return self.states.get(machine_id, "")

    def give_up_ahead(self, machine_id: str) -> None:
        self.given_up.append(machine_id)
        self.states.pop(machine_id, None)

    def end_ahead(self) -> list[str]:
        ended = list(self.states)
        self.states.clear()
        return ended


SPEC = MachineSpec(
    "first", "demo", "mad", "w1", ("sh",), {"A": "b"}, driver="sandbox",
    image_root="/images/busybox", netns="/run/netns/first", resolv_conf="/run/resolv.conf",
)  # fmt: skip


def slots() -> tuple[NetworkSlots, Driver, Network, AddressPool]:
    driver, network, pool = Driver(), Network(), AddressPool("w1")
    return NetworkSlots(driver, network, pool), driver, network, pool  # type: ignore[arg-type]


def test_a_slot_is_made_for_an_id_whose_address_is_held_and_a_claim_takes_both() -> None:
    s, driver, network, pool = slots()
    s.keep(SPEC, "org:acme", "img")
    s.keep(SPEC, "org:acme", "img")  # one per network and image
    (mid,) = driver.specs
    spec = driver.specs[mid]
    held = dict(pool.held())[mid]
    assert network.made == [mid] and spec.netns == f"/run/netns/{mid}" and spec.env == {}
    assert held.network == "org:acme"
    assert s.take("org:other", "img") is None and s.take("org:acme", "other") is None
    assert s.take("org:acme", "img") == mid
    assert pool.take(mid, "org:acme") == held  # the claim's address is the slot's
    assert s.take("org:acme", "img") is None  # taken once
    s.spawning(mid)
    s.unused(mid)  # (a destroy later: the slot is the machine's, nothing to give up)
    assert driver.given_up == [] and network.removed == []


def test_a_slot_being_made_is_not_taken_and_one_whose_making_failed_is_given_up() -> None:
    s, driver, network, pool = slots()
    driver.ready = False
    s.keep(SPEC, "org:acme", "img")
    (mid,) = driver.specs
    assert s.take("org:acme", "img") is None  # being made: the claim starts cold
    del driver.states[mid]  # its making failed
    assert s.take("org:acme", "img") is None
    assert network.removed == [mid] and mid not in dict(pool.held())
    s.keep(SPEC, "org:acme", "img")  # and the next start makes another
    assert len(driver.specs) == 2


def test_a_slot_whose_claim_fails_and_the_slots_of_an_agent_that_leaves_are_given_up() -> None:
    s, driver, network, pool = slots()
    s.keep(SPEC, "org:acme", "img")
    (mid,) = driver.specs
    assert s.take("org:acme", "img") == mid
    s.unused(mid)  # its claim failed before its record
    assert driver.given_up == [mid] and network.removed == [mid]
    assert mid not in dict(pool.held())
    s.keep(SPEC, "org:acme", "img")
    s.keep(SPEC, "org:acme", "other")
    s.close()
    assert len(network.removed) == 3 and not list(pool.held()) and not driver.states


def test_at_most_four_slots_at_once() -> None:
    s, driver, _, _ = slots()
    for n in range(6):
        s.keep(SPEC, f"org:n{n}", "img")
    assert len(driver.specs) == 4
