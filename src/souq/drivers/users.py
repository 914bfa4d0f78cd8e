"""Who machines run as: the user an agent switches to after placing a machine in its cgroup and
before its exec (souq-waiter does it, or ``subprocess.Popen`` without the waiter).

``souq agent --machine-user NAME|UID`` names it. Left out, machines run as ``nobody``
(65534:65534) when the agent runs as root, and as the agent's own user otherwise (an agent that
is not root cannot switch). Root is refused unless ``--allow-root-machines`` is given too, and
then logged as a warning at start.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

from souq.errors import InvalidInput

__all__ = ["NOBODY", "MachineUser", "agent_user", "machine_user"]

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
