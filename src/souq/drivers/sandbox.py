"""The sandbox driver's jail: a machine's command run under bubblewrap (``bwrap``).

Inside the sandbox the host's root file system is read-only, ``/tmp`` and ``/run`` are private
and empty, ``/dev`` is a minimal private one, ``/proc`` belongs to a new pid namespace (``bwrap``
is pid 1 there, the command pid 2), and ipc and uts namespaces are new too. The machine's own
directory is the one writable place, mounted at
:data:`WORKDIR` and used as the working directory; the agent's other machine directories are
hidden. A machine's volume is bound read-write at its mount path (``mounts``). With
``network=False`` the machine gets a network namespace of its own with only ``lo``.

A machine of an image sees the image's files read-only: as its root file system when the image
is a whole one (it has ``/bin`` or ``/usr/bin``), else at :data:`IMAGE_DIR` over the host's
root; either way it starts in the image's working directory. (The image is shared by every
machine of it on the worker, hence read-only; the machine's own directory stays writable.)

The process the agent watches is ``bwrap`` itself: it exits with the command's exit status
(``128 + n`` when the command was killed by signal ``n``), and signals sent to the machine's
process group reach the command, which stays in that group (no ``--new-session``). There is no
``--die-with-parent``: like exec machines, sandboxed machines outlive the agent and are
re-adopted by the next one.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["IMAGE_DIR", "WORKDIR", "Image", "available", "bwrap_argv"]

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


@functools.cache
def available() -> bool:
    """Whether ``bwrap`` is installed and can create the namespaces we need on this host."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False
    argv = [*bwrap_argv(Path("/"), network=False, machines_root=None, bwrap=bwrap), "/bin/true"]
    try:
        return subprocess.run(argv, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def bwrap_argv(
    workdir: Path,
    *,
    network: bool,
    machines_root: Path | None,
    bwrap: str = "bwrap",
    image: Image | None = None,
    mounts: tuple[tuple[str, str], ...] = (),
) -> list[str]:
    """The ``bwrap`` command line that jails whatever follows it (append the command).
    ``mounts``: volumes, (directory on the host, path inside), bound read-write; the agent's
    other volumes (their common parent) are hidden under an empty tmpfs first."""
    whole = image is not None and image.is_root
    root = str(image.root) if image is not None and whole else "/"
    argv = [
        bwrap,
        "--ro-bind", root, "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",  # noqa: S108 - a private, empty /tmp inside the sandbox
        "--tmpfs", "/run",
    ]  # fmt: skip
    hidden = ("/tmp", "/run")  # noqa: S108 - already private inside the sandbox
    if (
        not whole
        and machines_root is not None
        and not any(machines_root.is_relative_to(h) for h in hidden)
    ):
        argv += ["--tmpfs", str(machines_root)]  # other machines' files stay out of sight
    if image is not None and not whole:
        argv += ["--ro-bind", str(image.root), IMAGE_DIR]
    for parent in sorted({str(Path(host_dir).parent) for host_dir, _ in mounts}):
        argv += ["--tmpfs", parent]  # other volumes stay out of sight
    for host_dir, path in mounts:
        argv += ["--bind", host_dir, path]
    argv += [
        "--bind", str(workdir), WORKDIR,
        "--chdir", WORKDIR if image is None else image.start_dir(),
        "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--hostname", "sandbox",
    ]  # fmt: skip
    if not network:
        argv.append("--unshare-net")
    argv.append("--")
    return argv
