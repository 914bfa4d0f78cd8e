"""Who machines run as: the user an agent switches to after placing a machine in its cgroup and
before its exec (souq-waiter does it, or ``subprocess.Popen`` without the waiter).

``souq agent --machine-user NAME|UID`` names it. Left out, machines run as ``nobody``
(65534:65534) when the agent runs as root, and as the agent's own user otherwise (an agent that
is not root cannot switch). Root is refused unless ``--allow-root-machines`` is given too, and
then logged as a warning at start.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from souq.errors import InvalidInput

__all__ = ["NOBODY", "MachineUser", "agent_user", "check_reachable", "machine_user", "shut_in"]

NOBODY = 65534  # nobody and nogroup (or nobody) on every Linux distribution we know


@dataclass(frozen=True)
class MachineUser:
    """A user machines run as: its uid, primary gid and supplementary groups. ``switch`` is
    False when it is the agent's own user (nothing to change)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    @property
    def switch(self) -> bool:
        return (self.uid, self.gid) != (os.geteuid(), os.getegid())

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def waiter_field(self) -> str:
        """``UID:GID:G1,G2…`` for souq-waiter's job; empty when there is nothing to switch."""
        if not self.switch:
            return ""
        return f"{self.uid}:{self.gid}:{','.join(str(g) for g in self.groups)}"

    def describe(self) -> str:
        return f"{self.name} ({self.uid}:{self.gid})"

    def can_enter(self, path: Path) -> bool:
        """Whether this user may pass through directory ``path`` (its search bit)."""
        st = path.stat()
        if self.uid == 0:
            return True
        if st.st_uid == self.uid:
            return bool(st.st_mode & stat.S_IXUSR)
        if st.st_gid == self.gid or st.st_gid in self.groups:
            return bool(st.st_mode & stat.S_IXGRP)
        return bool(st.st_mode & stat.S_IXOTH)


def _of_uid(uid: int) -> MachineUser:
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:  # a uid with no name: its own group, none other
        return MachineUser(str(uid), uid, uid)
    return MachineUser(entry.pw_name, uid, entry.pw_gid, _groups(entry.pw_name, entry.pw_gid))


def _groups(name: str, gid: int) -> tuple[int, ...]:
    try:
        return tuple(sorted(set(os.getgrouplist(name, gid)) - {gid}))
    except OSError:
        return ()


def agent_user() -> MachineUser:
    """The agent's own user (nothing to switch): what a driver uses unless told otherwise."""
    return _of_uid(os.geteuid())


def _nobody() -> MachineUser:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return MachineUser("nobody", NOBODY, NOBODY)
    return MachineUser("nobody", entry.pw_uid, entry.pw_gid)


def machine_user(setting: str | None, *, allow_root: bool = False) -> MachineUser:
    """The user machines run as, from ``--machine-user`` (a name or a uid; None: the default).

    :class:`InvalidInput` for an unknown name, for root without ``allow_root``, and for another
    user than the agent's own when the agent is not root (it cannot switch)."""
    agent_root = os.geteuid() == 0
    if setting is None or setting == "":
        return _nobody() if agent_root else agent_user()
    if setting.isdigit():
        user = _of_uid(int(setting))
    else:
        try:
            entry = pwd.getpwnam(setting)
        except KeyError:
            raise InvalidInput(
                f"--machine-user {setting}: no such user on this host",
                hint="name an existing user or give a uid (default: nobody)",
            ) from None
        user = MachineUser(setting, entry.pw_uid, entry.pw_gid, _groups(setting, entry.pw_gid))
    if user.is_root and not allow_root:
        raise InvalidInput(
            "machines would run as root",
            hint="give --allow-root-machines too if that is really meant (they then own the host)",
        )
    if user.switch and not agent_root:
        raise InvalidInput(
            f"--machine-user {setting}: an agent that is not root runs machines as its own user",
            hint="leave --machine-user out, or run the agent as root",
        )
    return user


def check_reachable(user: MachineUser, directory: Path) -> None:
    """:class:`InvalidInput` when ``user`` cannot reach ``directory`` (where machines' working
    directories are): a machine would start in its directory but fail on any path through it
    (an app that serves its files answers 404), as under a home directory others may not
    enter (``/root`` is 0700)."""
    for ancestor in [*reversed(directory.resolve().parents), directory.resolve()]:
        if ancestor.exists() and not user.can_enter(ancestor):
            raise InvalidInput(
                f"machines run as {user.describe()}, who cannot enter {ancestor}, on the way "
                f"to their directories in {directory}",
                hint="give the agent a --data-dir that user can reach (e.g. under /var/lib), "
                f"let it through (chmod o+x {ancestor}), or choose --machine-user",
            )


def shut_in(data_dir: Path) -> None:
    """The agent's directory, and each directory in it, passable but not readable by others
    (0711): a machine's user reaches its own directory (and its image's files) by their path,
    but lists nothing of the agent's or of other machines'."""
    for directory in (data_dir, *data_dir.iterdir(), data_dir / "images" / "images"):
        with contextlib.suppress(OSError):
            if directory.is_dir() and not directory.is_symlink():
                directory.chmod(0o711)
