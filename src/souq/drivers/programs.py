"""The program a machine's command runs, found as the machine's user would find it.

A root agent's ``PATH`` often starts with directories only root may enter (``/root/.pyenv``,
mode 0700): looked up as root, ``python3`` resolves to a shim the machine's user cannot run,
and the machine dies at its ``execve`` with "Permission denied". ``execvp`` itself skips a
``PATH`` entry its caller cannot reach and goes on; so does :func:`resolve_as`, for the
machine's user: each candidate counts only if that user can pass through every directory on its
way (their search bits, for that user's class: owner, group or other) and execute the file.

Inside an image that is the machine's root file system, the lookup is in the image's files
(``root``) with the image's ``PATH``, symlinks followed inside the image (an absolute link is
the image's, not the host's), for the user the machine is inside (root: any execute bit).

When nothing runnable is found, :class:`~souq.drivers.base.SpawnError` names the program,
where it was found but not runnable (and why), and the user.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Mapping
from pathlib import Path

from souq.drivers.base import SpawnError
from souq.drivers.users import MachineUser

__all__ = ["DEFAULT_PATH", "ProgramNotRunnable", "in_image", "resolve_as", "resolve_in_image"]

# What Docker gives a container whose image sets no PATH.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LINKS_MAX = 40


class ProgramNotRunnable(SpawnError):
    """The machine's program is missing, or there but not runnable by its user."""

    def __init__(self, program: str, user: str, path: str | None = None, why: str = "") -> None:
        self.program, self.user, self.path, self.why = program, user, path, why
        if path is None:
            text = f"cannot run {program!r}: No such file or directory (looked up as {user})"
        else:
            text = f"cannot run {program!r} as {user}: {path}: {why}"
        super().__init__(text)


_ANY_X = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH


def _why_not(path: str, user: MachineUser) -> str | None:
    """Why ``user`` cannot execute ``path`` (a host path), or None when it can."""
    real = os.path.realpath(path)
    parts = Path(real).parents
    for directory in reversed(parts):
        try:
            if not user.can_enter(directory):
                return f"it is under {directory}, which that user cannot enter"
        except OSError as exc:
            return exc.strerror or str(exc)
    try:
        st = os.stat(real)
    except OSError as exc:
        return exc.strerror or str(exc)
    if not stat.S_ISREG(st.st_mode):
        return "not a program file (Permission denied)"
    # Root needs an execute bit of anyone's; another user, its class's (as for a directory).
    ok = bool(st.st_mode & _ANY_X) if user.uid == 0 else user.can_enter(Path(real))
    return None if ok else "that user may not execute it (Permission denied)"


def resolve_as(program: str, env: Mapping[str, str], workdir: Path, user: MachineUser) -> str:
    """The host path ``program`` runs as for ``user``: looked up in the machine's ``PATH``
    (skipping what the user cannot reach), or relative to its working directory."""
    if "/" in program:
        candidates = [program if os.path.isabs(program) else str(workdir / program)]
    else:
        path = env.get("PATH", os.environ.get("PATH", os.defpath))
        candidates = [os.path.join(d or ".", program) for d in path.split(os.pathsep)]
    refused: tuple[str, str] | None = None
    for candidate in candidates:
        if not os.path.lexists(candidate):
            continue
        why = _why_not(candidate, user)
        if why is None:
            return candidate
        refused = refused or (candidate, why)
    if refused is None:
        raise ProgramNotRunnable(program, user.describe())
    raise ProgramNotRunnable(program, user.describe(), *refused)


def in_image(root: Path, path: str) -> Path | None:
    """``path`` (absolute, inside the image) as a host path under ``root``, every symlink
    followed within the image; None when it does not exist."""
    parts = [p for p in path.split("/") if p]
    here = ""
    links = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            here = posixpath.dirname(here)
            continue
        if part == ".":
            continue
        candidate = f"{here}/{part}"
        host = root / candidate.lstrip("/")
        try:
            st = os.lstat(host)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _LINKS_MAX:
                return None
            target = os.readlink(host)
            parts = [p for p in target.split("/") if p] + parts
            if target.startswith("/"):
                here = ""
            continue
        here = candidate
    return root / here.lstrip("/")


def resolve_in_image(
    program: str, env: Mapping[str, str], workdir: str, root: Path, user: str
) -> str:
    """The path inside the image ``program`` runs as (for a machine whose root file system is
    the image at ``root``), looked up in the image's ``PATH``; the machine is root inside."""
    if "/" in program:
        candidates = [program if program.startswith("/") else posixpath.join(workdir, program)]
    else:
        path = env.get("PATH", DEFAULT_PATH)
        candidates = [posixpath.join(d or workdir, program) for d in path.split(":")]
    refused: tuple[str, str] | None = None
    for candidate in candidates:
        host = in_image(root, candidate)
        if host is None:
            continue
        try:
            st = os.stat(host)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mode & _ANY_X:
            return candidate
        refused = refused or (candidate, "not an executable file in the image")
    if refused is None:
        raise ProgramNotRunnable(program, user)
    raise ProgramNotRunnable(program, user, *refused)
