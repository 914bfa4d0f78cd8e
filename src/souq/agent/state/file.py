"""The agent's state file on disk, around SQLite: one agent per data dir (a lock), the file and
its WAL readable by the agent's user alone, and the refusal to start after a corrupt file was
set aside (:mod:`souq.agent.state.store`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from souq.errors import StorageError

__all__ = ["SET_ASIDE_HINT", "lock", "private", "refuse_set_aside"]

SET_ASIDE_HINT = (
    "restore state.db from a backup, or delete the corrupt copy to start with an empty state "
    "(the machines it knew are then forgotten; their processes may still run)"
)


def refuse_set_aside(path: Path) -> None:
    """Keep refusing to start after a corrupt state file was set aside, until someone decides."""
    if path.exists():
        return
    aside = sorted(path.parent.glob(f"{path.name}.corrupt-*[0-9]"))
    if aside:
        raise StorageError(
            f"the agent's state file was corrupt and set aside as {aside[-1]}",
            hint=SET_ASIDE_HINT,
            details={"set_aside": str(aside[-1])},
        )


def private(path: Path) -> None:
    """The state file (made if need be) and its WAL readable by the agent's user alone: its
    machines run as another user and must not read it. SQLite gives the WAL and shared-memory
    files it makes the database file's mode."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(name, 0o600)
    except OSError as exc:
        raise StorageError(f"cannot make {path} private: {exc.strerror or exc}") from exc


def lock(path: Path) -> int:
    """The data dir's lock, held while the agent runs: one agent per data dir."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StorageError(
            f"another agent is using the data dir {path.parent}",
            hint="stop that agent first, or give this one its own --data-dir",
        ) from None
    return fd
