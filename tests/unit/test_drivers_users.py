"""Whether the machines' user can reach their directories: refused at the agent's start with
the directory that stops it named, rather than apps that fail on every path later."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from souq.drivers.users import NOBODY, MachineUser, check_reachable
from souq.errors import InvalidInput

NOBODY_USER = MachineUser("nobody", NOBODY, NOBODY)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory under /tmp anyone may enter (pytest's own base directory is private)."""
    path = Path(tempfile.mkdtemp(prefix="souq-users-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_private_ancestor_is_named(open_dir: Path) -> None:
    private = open_dir / "home"
    machines = private / "data" / "machines"
    machines.mkdir(parents=True)
    private.chmod(0o700)
    with pytest.raises(InvalidInput) as refused:
        check_reachable(NOBODY_USER, machines)
    assert f"cannot enter {private}, on the way" in refused.value.message
    assert f"chmod o+x {private}" in (refused.value.hint or "")


def test_a_reachable_directory_passes(open_dir: Path) -> None:
    machines = open_dir / "data" / "machines"
    machines.mkdir(parents=True, mode=0o755)
    (open_dir / "data").chmod(0o755)
    machines.chmod(0o755)
    check_reachable(NOBODY_USER, machines)


def test_the_owner_and_group_bits_count(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    d.chmod(0o710)
    owner = MachineUser("me", d.stat().st_uid, 12345)
    group = MachineUser("g", 54321, d.stat().st_gid)
    other = MachineUser("o", 54321, 12345)
    assert owner.can_enter(d) and group.can_enter(d) and not other.can_enter(d)
