"""Which optional protocols a driver offers, answered once per driver class."""

from __future__ import annotations

from souq.drivers.base import (
    ChoosesDrivers,
    HasMachineDirs,
    JoinsCgroups,
    MakesAhead,
    PreparesSpawns,
    RecordsExits,
    chooses_drivers,
    has_machine_dirs,
    joins_cgroups,
    makes_ahead,
    prepares_spawns,
    records_exits,
)
from souq.drivers.exec import ExecDriver
from souq.drivers.host import HostDriver


class Plain:
    """A driver offering none of the optional protocols."""


class Joins:
    def join_prefix(self, machine_id: str) -> tuple[str, ...]:
        return ("join", machine_id)


class JoinsToo(Joins):
    """Offers what its base offers."""


def test_each_guard_answers_as_isinstance_does_for_souqs_drivers_and_others() -> None:
    guards = {
        chooses_drivers: ChoosesDrivers,
        prepares_spawns: PreparesSpawns,
        records_exits: RecordsExits,
        joins_cgroups: JoinsCgroups,
        makes_ahead: MakesAhead,
        has_machine_dirs: HasMachineDirs,
    }
    for kind in (HostDriver, ExecDriver, Plain, Joins, JoinsToo):
        driver = object.__new__(kind)
        for guard, protocol in guards.items():
            for _ in range(2):  # the second answer comes from what the first found
                assert guard(driver) is isinstance(driver, protocol), (kind, protocol)


def test_a_class_that_offers_nothing_is_told_so_and_one_that_does_is_not() -> None:
    assert not joins_cgroups(Plain())
    assert joins_cgroups(Joins()) and joins_cgroups(JoinsToo())
    assert chooses_drivers(object.__new__(HostDriver))
    assert makes_ahead(object.__new__(HostDriver)) and not makes_ahead(object.__new__(ExecDriver))
    assert has_machine_dirs(object.__new__(HostDriver)) and has_machine_dirs(
        object.__new__(ExecDriver)
    )
