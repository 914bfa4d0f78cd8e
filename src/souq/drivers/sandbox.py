"""The sandbox driver's jail: a machine's command run under bubblewrap (``bwrap``).

Inside the sandbox the host's root file system is read-only, ``/tmp`` and ``/run`` are private
and empty, ``/dev`` is a minimal private one, ``/proc`` belongs to a new pid namespace (``bwrap``
is pid 1 there, the command pid 2), and ipc and uts namespaces are new too. The machine's own
directory is the one writable place, mounted at
:data:`WORKDIR` and used as the working directory; the agent's other machine directories are
hidden. A machine's volume is bound read-write at its mount path (``mounts``). With
``network=False`` the machine gets a network namespace of its own with only ``lo``.

A machine of an image whose files are a whole root file system (it has ``/bin`` or
``/usr/bin``) runs in it as its ``/``: with ``overlay`` (a root agent), that is the overlay of
the image's files and the machine's own writable layer (:mod:`souq.drivers.rootfs`), bound
read-write; otherwise the image's files themselves, read-only (shared by every machine of the
image). An image of an app's files alone is mounted read-only at :data:`IMAGE_DIR` over the
host's root. Either way it starts in the image's working directory.

A machine of its own host uid (:mod:`souq.drivers.identity`) runs ``bwrap`` as that uid with
``--unshare-user``: root inside its user namespace (or the image's ``User``, ``inner``) is
that uid outside, and nothing else is mapped. Its own files (its directory, its writable layer)
are that uid's, so they are root's inside.

The process the agent watches is ``bwrap`` itself: it exits with the command's exit status
(``128 + n`` when the command was killed by signal ``n``). The command runs in a session and
process group of its own (``--new-session``: it cannot push input into a terminal outside),
and the machine's signals go to that group (:func:`souq.drivers.enter.machine_command`): a
signal to ``bwrap``'s group would end the outer ``bwrap`` first, and the waiter would then
SIGKILL what is left before the command could act on it. SIGKILL goes to ``bwrap``'s group:
the sandbox's init is in it, and the pid namespace ends with its init. With
``die_with_parent`` (the parent is a souq-waiter, which outlives the agent) the sandbox also
ends if its waiter is killed; without a waiter the parent is the agent, and like exec machines
sandboxed machines must outlive it to be re-adopted by the next one.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from souq.drivers.base import SpawnError
from souq.drivers.programs import in_image

__all__ = [
    "IMAGE_DIR",
    "PRIVATE_DIRS",
    "WORKDIR",
    "Image",
    "available",
    "bwrap_argv",
    "hidden_under",
    "inner_ids",
    "unavailable",
]

WORKDIR = "/run/souq"
IMAGE_DIR = "/app"


@dataclass(frozen=True)
class Image:
    """A machine's image files on the host, and where in them it starts."""

    root: Path
    workdir: str = ""  # relative to ``root``

    @classmethod
    def of(cls, root: str | None, cwd: str | None) -> Image | None:
        if root is None:
            return None
        path = Path(root)
        inside = Path(cwd).relative_to(path).as_posix() if cwd else ""
        return cls(path, "" if inside == "." else inside)

    @property
    def is_root(self) -> bool:
        """A whole root file system (with programs of its own), not an app's files alone."""
        return (self.root / "bin").is_dir() or (self.root / "usr" / "bin").is_dir()

    def start_dir(self) -> str:
        """The working directory inside the sandbox."""
        base = "/" if self.is_root else IMAGE_DIR
        return str(Path(base) / self.workdir) if self.workdir else base


def inner_ids(root: Path, user: str) -> tuple[int, int]:
    """The uid and gid a machine of an image whose config says ``User`` (Docker's forms:
    ``name``, ``uid``, ``name:group``, ``uid:gid``) runs as inside: names are the image's own
    (its ``/etc/passwd`` and ``/etc/group``); empty is root. :class:`SpawnError` for a name the
    image does not have."""
    if not user:
        return 0, 0
    name, _, group = user.partition(":")
    passwd = _entries(root, "etc/passwd")
    if name.isdigit():
        uid = int(name)
        gid = next((int(e[3]) for e in passwd if e[2] == name and e[3].isdigit()), uid)
    else:
        entry = next((e for e in passwd if e[0] == name), None)
        if entry is None or not entry[2].isdigit() or not entry[3].isdigit():
            raise SpawnError(f"the image's User {user!r}: no user {name!r} in its /etc/passwd")
        uid, gid = int(entry[2]), int(entry[3])
    if group.isdigit():
        gid = int(group)
    elif group:
        found = next((e for e in _entries(root, "etc/group") if e[0] == group), None)
        if found is None or not found[2].isdigit():
            raise SpawnError(f"the image's User {user!r}: no group {group!r} in its /etc/group")
        gid = int(found[2])
    return uid, gid


def _entries(root: Path, name: str) -> list[list[str]]:
    """The colon-separated lines of one of the image's files (none if it has no such file),
    its links followed within the image: an absolute one is the image's, never the host's."""
    path = in_image(root, "/" + name)
    try:
        if path is None or path.is_symlink() or not path.is_file():
            return []
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line.split(":") for line in lines if line and not line.startswith("#")]


def available() -> bool:
    """Whether ``bwrap`` is installed and can create the namespaces we need on this host."""
    return unavailable() is None


@functools.cache
def unavailable() -> str | None:
    """Why this host cannot run the sandbox (None: it can): ``bwrap`` is missing, or cannot
    make the namespaces (as root, also a user namespace for an unprivileged uid)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    argv = [*bwrap_argv(Path("/"), network=False, machines_root=None, bwrap=bwrap), "/bin/true"]
    tries: list[tuple[list[str], dict[str, object]]] = [(argv, {})]
    if os.geteuid() == 0:  # machines of their own uid run bwrap as it, in a user namespace
        inner = bwrap_argv(Path("/"), network=False, machines_root=None, bwrap=bwrap, inner=(0, 0))
        nobody = {"user": 65534, "group": 65534, "extra_groups": []}
        tries.append(([*inner, "/bin/true"], nobody))
    for command, user in tries:
        try:
            done = subprocess.run(  # type: ignore[call-overload]
                command, capture_output=True, timeout=10, check=False, cwd="/", **user
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"bwrap cannot run: {exc}"
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            return "bwrap cannot make the namespaces here: " + (said[-1] if said else "failed")
    return None


def bwrap_argv(
    workdir: Path,
    *,
    network: bool,
    machines_root: Path | None,
    bwrap: str = "bwrap",
    image: Image | None = None,
    mounts: tuple[tuple[str, str], ...] = (),
    overlay: Path | None = None,
    inner: tuple[int, int] | None = None,
    hostname: str = "sandbox",
    die_with_parent: bool = False,
) -> list[str]:
    """The ``bwrap`` command line that jails whatever follows it (append the command).
    ``mounts``: volumes, (directory on the host, path inside), bound read-write at any path
    (a read-only root that lacks one is opened for it: :func:`mount_points_to_open`); the
    agent's other volumes (their common parent) are hidden under an empty tmpfs first.
    ``overlay``: the machine's mounted root file system (an image's, whole), bound read-write
    as ``/``.
    ``inner``: the uid and gid it runs as inside a user namespace of its own (bwrap is then run
    by the machine's host uid, which they map to)."""
    whole = image is not None and image.is_root
    # Read-only directories given a tmpfs to hold volumes' mount points, and those points.
    opened: dict[str, list[str]] = {}
    root = "/"
    if overlay is not None and whole:
        argv = [bwrap, "--bind", str(overlay), "/", "--dev", "/dev", "--proc", "/proc"]
    else:
        root = str(image.root) if image is not None and whole else "/"
        hidden_dirs = [str(machines_root)] if machines_root is not None and not whole else []
        opened = mount_points_to_open(Path(root), [path for _, path in mounts], hidden_dirs)
        base = _opened(Path(root), "/", opened["/"]) if "/" in opened else ["--ro-bind", root, "/"]
        argv = [
            bwrap,
            *base,
            "--dev", "/dev",
            "--proc", "/proc",
            "--tmpfs", "/tmp",  # noqa: S108 - a private, empty /tmp inside the sandbox
            "--tmpfs", "/run",
        ]  # fmt: skip
    hidden = PRIVATE_DIRS
    if (
        not whole
        and machines_root is not None
        and not any(machines_root.is_relative_to(h) for h in hidden)
    ):
        argv += ["--tmpfs", str(machines_root)]  # other machines' files stay out of sight
    if image is not None and not whole:
        argv += ["--ro-bind", str(image.root), IMAGE_DIR]
    for parent in sorted({str(Path(host_dir).parent) for host_dir, _ in mounts}):
        if overlay is None or not whole:
            argv += ["--tmpfs", parent]  # other volumes stay out of sight
    for directory, points in opened.items():
        if directory != "/":
            argv += _opened(Path(root) / directory[1:], directory, points)
    for host_dir, path in mounts:
        argv += ["--bind", host_dir, path]
    if overlay is None or not whole:
        argv += ["--bind", str(workdir), WORKDIR]
    start = WORKDIR if image is None else image.start_dir()
    argv += _process_argv(start, hostname, inner, network=network, die_with_parent=die_with_parent)
    argv.append("--")
    return argv


def _process_argv(
    start: str,
    hostname: str,
    inner: tuple[int, int] | None,
    *,
    network: bool,
    die_with_parent: bool,
) -> list[str]:
    """Where the command starts, and the namespaces, session and ids it runs in."""
    argv = [
        "--chdir", start,
        "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--hostname", hostname,
        "--new-session",
    ]  # fmt: skip
    if die_with_parent:
        argv.append("--die-with-parent")
    if inner is not None:
        # --disable-userns: the command runs in a user namespace nested in the one that owns
        # the sandbox's mounts, and can make no other; root inside (or an exec entering it)
        # holds no capability over those mounts (it cannot unmount /tmp to see the host's).
        argv += ["--unshare-user", "--uid", str(inner[0]), "--gid", str(inner[1])]
        argv.append("--disable-userns")
    if not network:
        argv.append("--unshare-net")
    return argv


# A sandbox's own, empty at its start: what the host keeps there is out of a machine's sight.
PRIVATE_DIRS = ("/tmp", "/run")  # noqa: S108


def hidden_under(path: str) -> str | None:
    """The directory of :data:`PRIVATE_DIRS` that hides the host's ``path`` from a sandboxed
    machine (it sees its own there), or None."""
    return next((d for d in PRIVATE_DIRS if path == d or path.startswith(d + "/")), None)


_PRIVATE = ("/dev", "/proc", "/tmp", "/run")  # noqa: S108 - the sandbox's own, whatever the root


def mount_points_to_open(root: Path, paths: list[str], hidden: list[str]) -> dict[str, list[str]]:
    """The directories of a read-only ``root`` in which a volume's mount point is missing
    (bwrap cannot make it there), each with the paths it is to hold: for each path that
    ``root`` lacks, its deepest existing ancestor; none for a path in a private tmpfs inside
    (``/tmp``, ``/run``, a ``hidden`` one). Shallowest first, so that a directory is
    opened before one under it."""
    found: dict[str, list[str]] = {}
    private = (*_PRIVATE, *hidden)
    for path in paths:
        inside = Path("/", path)
        if any(inside.is_relative_to(p) for p in private):
            continue  # a tmpfs inside, where bwrap makes it
        if (root / inside.relative_to("/")).exists():
            continue
        ancestor = inside.parent
        while ancestor != Path("/") and not (root / ancestor.relative_to("/")).is_dir():
            ancestor = ancestor.parent
        found.setdefault(str(ancestor), []).append(str(inside))
    return dict(sorted(found.items(), key=lambda item: (len(Path(item[0]).parts), item[0])))


def _opened(directory: Path, inside: str, points: list[str]) -> list[str]:
    """bwrap arguments that make ``inside`` a tmpfs (``/``: bwrap's own root is one) holding,
    read-only, what ``directory`` holds (each entry bound, each link made again) and the
    mount ``points`` it is opened for, and then read-only itself (before anything is mounted
    under it: bwrap's ``--remount-ro`` reaches the mounts under it too)."""
    argv = [] if inside == "/" else ["--tmpfs", inside]
    argv += _entries_of(directory, inside)
    for point in [*_PRIVATE, *points] if inside == "/" else points:
        argv += ["--dir", point]
    return [*argv, "--remount-ro", inside]


def _entries_of(directory: Path, inside: str) -> list[str]:
    """bwrap arguments that put back, read-only, what ``directory`` holds at ``inside``: each
    entry bound, each link made again."""
    argv: list[str] = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        target = str(Path(inside) / entry.name)
        if target in _PRIVATE:
            continue
        if entry.is_symlink():
            argv += ["--symlink", os.readlink(entry.path), target]
        else:
            argv += ["--ro-bind", entry.path, target]
    return argv
