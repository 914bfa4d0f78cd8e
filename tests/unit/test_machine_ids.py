"""A uid taken ahead, for a sandbox made before its machine (souq.drivers.warm), and handed to
the machine that takes the sandbox: the registry in a directory of the test's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from souq.drivers.base import SpawnError
from souq.drivers.identity import MachineIds


def ids(tmp_path: Path) -> MachineIds:
    return MachineIds(registry=tmp_path / "uids", base=5000, count=16)


def test_a_uid_handed_over_is_the_machines_and_its_release_frees_it(tmp_path: Path) -> None:
    registry = ids(tmp_path)
    slot, machine = tmp_path / "agent" / "warm-1-0", tmp_path / "agent" / "m1"
    ahead = registry.take_ahead("warm-1-0", slot)
    handed = registry.hand_over("warm-1-0", "m1", slot, machine)
    assert handed.uid == ahead.uid
    assert handed.name == "machine m1"
    assert registry.recorded(machine) == ahead.uid
    assert not slot.exists()  # the slot's records became the machine's
    assert (tmp_path / "uids" / str(ahead.uid)).read_text() == "warm-1-0\n"
    assert registry.user("m1", machine).uid == ahead.uid  # its next start keeps it
    other = registry.user("m2", tmp_path / "agent" / "m2")
    assert other.uid != ahead.uid  # held: nobody else gets it
    registry.release("m1", machine)
    assert not (tmp_path / "uids" / str(ahead.uid)).exists()


def test_a_uid_handed_to_a_machine_with_records_joins_them(tmp_path: Path) -> None:
    registry = ids(tmp_path)
    slot, machine = tmp_path / "agent" / "warm-1-0", tmp_path / "agent" / "m1"
    machine.mkdir(parents=True)
    (machine / "output.log").write_text("earlier\n")
    ahead = registry.take_ahead("warm-1-0", slot)
    registry.hand_over("warm-1-0", "m1", slot, machine)
    assert registry.recorded(machine) == ahead.uid
    assert (machine / "output.log").read_text() == "earlier\n"
    assert not slot.exists()


def test_a_release_by_another_name_leaves_the_uid_held(tmp_path: Path) -> None:
    registry = ids(tmp_path)
    records = tmp_path / "agent" / "warm-1-0"
    ahead = registry.take_ahead("warm-1-0", records)
    registry.release("someone-else", tmp_path / "agent" / "nothing")
    assert (tmp_path / "uids" / str(ahead.uid)).exists()
    registry.release("warm-1-0", records)  # the slot given up
    assert not (tmp_path / "uids" / str(ahead.uid)).exists()


def test_nothing_to_hand_over_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SpawnError, match="no uid recorded"):
        ids(tmp_path).hand_over("warm-1-0", "m1", tmp_path / "none", tmp_path / "m1")
