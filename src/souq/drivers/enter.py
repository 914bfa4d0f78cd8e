"""Entering a sandboxed machine: the namespaces its command lives in apart from the worker's,
and the ``nsenter`` (util-linux) command line that runs another command in them, as the
machine's own command runs. ``exec`` uses it; ``ps`` uses :func:`pid_namespace_members`.

**Which process.** The process the agent watches is ``bwrap``. With ``--unshare-pid`` it forks a
child in the new namespaces that is pid 1 there (the machine's init, which reaps orphans), and
that child forks the command (pid 2). The command is the one entered: its namespaces are its
init's, and its environment (bwrap's ``--setenv`` reaches the command alone) and root are the
machine's. Until the init has forked the command, bwrap is still building the sandbox (its
mounts are not all in place) and nothing enters it (:class:`CannotEnter`, ``setting_up``).
Under ``--as-pid-1`` the init is the command itself (it no longer runs bwrap).

**Where.** The entered command runs in the machine's own working directory, the one bwrap
started its command in, given as a path inside (``--wdns``: looked up once nsenter is in the
machine's mount namespace and root), whatever directory the command has moved to since. An
nsenter older than util-linux 2.38 has no ``--wdns``: there it takes the command's (``--wd``).

**Credentials.** ``nsenter`` runs as root. As root it enters every namespace but the user
namespace first, then the user namespace; then it takes the command's uid and gid as that user
namespace maps them (``0`` for a machine that is root inside). The process is the machine's
host uid, never host root. Without a user namespace of its own (``bwrap`` run by root) it takes
the command's host uid and gid, and supplementary groups are dropped.

**Capabilities.** A process that enters a user namespace holds every capability in it (the
kernel resets its sets on ``setns``), and root there keeps them across its ``exec``. ``bwrap``
drops those of the machine's command. Where that user namespace also owns the machine's mount
(or another entered) namespace, an entered root could undo the sandbox: unmount the tmpfs that
hides other machines, remount ``/`` writable. Such a machine is not entered (``wider``):
``bwrap --disable-userns`` puts the command in a nested user namespace that owns none of them,
and entering that one grants nothing over the sandbox.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

__all__ = [
    "NAMESPACES",
    "CannotEnter",
    "Entry",
    "all_caps",
    "differing",
    "entry_of",
    "inside_id",
    "inside_pid",
    "machine_command",
    "machine_init",
    "namespaces_of",
    "nsenter_argv",
    "parse_status",
    "pid_namespace_members",
    "sets_wd_inside",
    "widens",
]

# The namespaces a process can have apart from the worker's, as /proc/PID/ns names them, and
# the nsenter option that enters each (in nsenter's own order).
NAMESPACES: dict[str, str] = {
    "user": "--user",
    "cgroup": "--cgroup",
    "ipc": "--ipc",
    "uts": "--uts",
    "net": "--net",
    "pid": "--pid",
    "mnt": "--mount",
    "time": "--time",
}
_NS_GET_USERNS = 0xB701  # ioctl: the user namespace that owns a namespace (linux/nsfs.h)
_INIT_DEPTH = 3  # bwrap's child is the handle's own; a wrapper or two above it is allowed

Reason = Literal["gone", "setting_up", "unmapped", "wider"]


class CannotEnter(Exception):
    """The machine's namespaces cannot be entered now; ``reason`` says why: ``gone`` (its
    processes exited), ``setting_up`` (bwrap is still building the sandbox), ``unmapped`` (its
    command's ids have no name inside its user namespace), ``wider`` (an entered process would
    hold capabilities over the sandbox that its command does not)."""

    def __init__(self, message: str, reason: Reason) -> None:
        super().__init__(message)
        self.reason: Reason = reason


@dataclass(frozen=True)
class Entry:
    """How to enter one machine: the host pid whose namespaces are entered (its command), the
    kinds that differ from the worker's, and the uid and gid to take there (None: keep)."""

    target: int
    namespaces: tuple[str, ...]
    uid: int | None = None
    gid: int | None = None


# -- pure -------------------------------------------------------------------------------------


def differing(target: Mapping[str, int], own: Mapping[str, int]) -> tuple[str, ...]:
    """The kinds of namespace (by inode) in which ``target`` is not where ``own`` is, in
    :data:`NAMESPACES` order; a kind either side lacks (an older kernel's) is left out."""
    return tuple(k for k in NAMESPACES if k in target and k in own and target[k] != own[k])


def inside_id(host_id: int, id_map: str) -> int | None:
    """``host_id`` as a user namespace names it, from its ``uid_map`` or ``gid_map`` as read from
    the host (lines ``INSIDE OUTSIDE COUNT``); None when the namespace does not map it."""
    for line in id_map.splitlines():
        fields = line.split()
        if len(fields) != 3:
            continue
        inside, outside, count = (int(f) for f in fields)
        if outside <= host_id < outside + count:
            return inside + host_id - outside
    return None


def parse_status(text: str) -> dict[str, str]:
    """``/proc/PID/status`` as {key: value} (the value stripped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def inside_pid(status: Mapping[str, str]) -> int | None:
    """The pid a process has in its own pid namespace: the last of ``NSpid``."""
    pids = status.get("NSpid", "").split()
    return int(pids[-1]) if pids else None


def all_caps(last_cap: int) -> int:
    """The set of every capability (``/proc/sys/kernel/cap_last_cap`` is the highest), as a
    ``CapBnd`` mask: what a process holds in a user namespace it has just entered."""
    return (1 << (last_cap + 1)) - 1


def widens(entry: Entry, owned: Iterable[str], command_bounding: int, every: int) -> bool:
    """Whether a process entering as ``entry`` would hold capabilities the machine's command
    does not: root in the entered user namespace (so every capability there, after ``exec``)
    while the command's bounding set lacks some, and that user namespace owns another of the
    namespaces entered (``owned``: the kinds it owns), so they would act on the sandbox."""
    if "user" not in entry.namespaces or entry.uid != 0:
        return False
    if command_bounding & every == every:
        return False
    return bool(set(owned) & (set(entry.namespaces) - {"user"}))


def nsenter_argv(entry: Entry, nsenter: str = "nsenter", wd: str | None = None) -> list[str]:
    """The argv prefix that runs a command (append it) in ``entry``'s namespaces, with its
    root the target's (``--root``: taken from ``/proc/PID`` as nsenter starts, not a path
    looked up again) and its working directory ``wd``, a path inside the machine looked up
    there (``--wdns``); None: the target's own (``--wd``)."""
    argv = [nsenter, f"--target={entry.target}", *(NAMESPACES[k] for k in entry.namespaces)]
    if entry.uid is not None:
        argv.append(f"--setuid={entry.uid}")
    if entry.gid is not None:
        argv.append(f"--setgid={entry.gid}")
    return [*argv, "--root", "--wd" if wd is None else f"--wdns={wd}", "--"]


# -- reading /proc ----------------------------------------------------------------------------


@functools.cache
def sets_wd_inside(nsenter: str) -> bool:
    """Whether this ``nsenter`` takes a working directory inside the entered namespaces
    (``--wdns``, util-linux 2.38 and later), as its usage says."""
    try:
        usage = subprocess.run(
            [nsenter, "--help"], capture_output=True, timeout=10, check=False, text=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "--wdns" in usage


def namespaces_of(pid: int | Literal["self"]) -> dict[str, int]:
    """{kind: inode} of the process's namespaces (the kinds this kernel has)."""
    out: dict[str, int] = {}
    for kind in NAMESPACES:
        with contextlib.suppress(OSError):
            out[kind] = os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    return out


def _status(pid: int) -> dict[str, str]:
    try:
        return parse_status(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        raise CannotEnter(f"process {pid} has exited", "gone") from None


def _children(pid: int) -> list[int]:
    """The pids of ``pid``'s children, as each of its threads' ``/proc/PID/task/TID/children``
    lists them: a read of its own, where psutil's ``children()`` reads the status of every
    process on the host (a preempted machine's stop signal looks its command up, inside the
    claim that displaced it). Where the kernel keeps no such list, psutil's way."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        raise CannotEnter(f"process {pid} has exited", "gone") from None
    if tasks and os.access(f"/proc/{pid}/task/{tasks[0]}/children", os.R_OK):
        kids: list[int] = []
        for tid in tasks:
            with (
                contextlib.suppress(FileNotFoundError),  # a thread that ended meanwhile
                open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f,
            ):
                kids.extend(int(kid) for kid in f.read().split())
        return kids
    try:
        return [kid.pid for kid in psutil.Process(pid).children()]
    except psutil.Error:
        raise CannotEnter(f"process {pid} has exited", "gone") from None


def _oldest_child(pid: int) -> int | None:
    ages: list[tuple[float, int]] = []
    for kid in _children(pid):
        with contextlib.suppress(psutil.Error):
            ages.append((psutil.Process(kid).create_time(), kid))
    return min(ages)[1] if ages else None


def machine_init(handle_pid: int) -> int | None:
    """The first process under the one the agent watches (itself included) that is in a pid
    namespace of its own: bwrap's child, the machine's pid 1. None when there is none (yet)."""
    own = namespaces_of("self").get("pid")
    pid: int | None = handle_pid
    for _ in range(_INIT_DEPTH + 1):
        if pid is None:
            return None
        if namespaces_of(pid).get("pid") not in (own, None):
            return pid
        pid = _oldest_child(pid)
    return None


def _same_program(a: int, b: int) -> bool:
    try:
        x, y = os.stat(f"/proc/{a}/exe"), os.stat(f"/proc/{b}/exe")
    except OSError:
        return False
    return (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino)


def _command(handle_pid: int) -> int:
    init = machine_init(handle_pid)
    if init is None:
        raise CannotEnter(f"process {handle_pid} has no sandbox under it (yet)", "setting_up")
    child = _oldest_child(init)
    if child is not None:
        if _same_program(child, init):  # forked by bwrap, its command not yet exec'd
            raise CannotEnter("bwrap is still setting up the sandbox", "setting_up")
        return child
    try:
        parent = psutil.Process(init).ppid()
    except psutil.Error:
        raise CannotEnter(f"process {init} has exited", "gone") from None
    if _same_program(init, parent):
        raise CannotEnter("bwrap is still setting up the sandbox", "setting_up")
    return init  # --as-pid-1: the init is the command


def machine_command(handle_pid: int) -> int | None:
    """The host pid of the sandboxed machine's command (the leader of its own session and
    process group, under ``bwrap --new-session``), or None when there is no sandbox under
    ``handle_pid`` or it is still being set up."""
    try:
        return _command(handle_pid)
    except CannotEnter:
        return None


def _ids(command: int, status: Mapping[str, str], kinds: tuple[str, ...]) -> tuple[int, int]:
    """The uid and gid to take: the command's, as its user namespace names them."""
    uid, gid = int(status["Uid"].split()[0]), int(status["Gid"].split()[0])
    if "user" not in kinds:
        return uid, gid
    try:
        inside = (
            inside_id(uid, Path(f"/proc/{command}/uid_map").read_text()),
            inside_id(gid, Path(f"/proc/{command}/gid_map").read_text()),
        )
    except OSError:
        raise CannotEnter(f"process {command} has exited", "gone") from None
    if inside[0] is None or inside[1] is None:
        raise CannotEnter(
            f"the machine's ids ({uid}:{gid}) have no name in its user namespace", "unmapped"
        )
    return inside[0], inside[1]


def _owned(pid: int, kinds: Iterable[str]) -> set[str]:
    """The kinds among ``kinds`` whose namespace (of ``pid``) its own user namespace owns."""
    try:
        own_user = os.stat(f"/proc/{pid}/ns/user").st_ino
    except OSError:
        return set()
    owned: set[str] = set()
    for kind in kinds:
        if kind == "user":
            continue
        with contextlib.suppress(OSError):
            fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                owner = fcntl.ioctl(fd, _NS_GET_USERNS)
                try:
                    if os.fstat(owner).st_ino == own_user:
                        owned.add(kind)
                finally:
                    os.close(owner)
            finally:
                os.close(fd)
    return owned


def _last_cap() -> int:
    try:
        return int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        return 63


def entry_of(handle_pid: int) -> Entry:
    """How to enter the sandboxed machine whose watched process (bwrap) is ``handle_pid``;
    :class:`CannotEnter` when it cannot be now."""
    command = _command(handle_pid)
    status = _status(command)
    kinds = differing(namespaces_of(command), namespaces_of("self"))
    uid, gid = _ids(command, status, kinds)
    if "user" not in kinds and (uid, gid) == (os.geteuid(), os.getegid()):
        entry = Entry(command, kinds)
    else:
        entry = Entry(command, kinds, uid, gid)
    bounding = int(status.get("CapBnd", "0"), 16)
    if widens(entry, _owned(command, kinds), bounding, all_caps(_last_cap())):
        raise CannotEnter(
            "root entering the machine's user namespace would hold capabilities over its "
            "sandbox (that namespace owns its mounts) that the machine's command does not",
            "wider",
        )
    return entry


def pid_namespace_members(init: int) -> list[tuple[int, int]]:
    """Every process in ``init``'s pid namespace (the machine's, exec'd ones too): (host pid,
    pid inside), by the pid inside."""
    try:
        ns = os.stat(f"/proc/{init}/ns/pid").st_ino
    except OSError:
        return []
    members: list[tuple[int, int]] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}/ns/pid").st_ino != ns:
                continue
            inside = inside_pid(parse_status(Path(f"/proc/{name}/status").read_text()))
        except OSError:
            continue  # gone meanwhile
        if inside is not None:
            members.append((int(name), inside))
    return sorted(members, key=lambda m: m[1])
