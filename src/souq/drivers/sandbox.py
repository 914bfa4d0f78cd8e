"""The sandbox driver's jail: a machine's command run under bubblewrap (``bwrap``).

Inside the sandbox the host's root file system is read-only, ``/tmp`` and ``/run`` are private
and empty, ``/dev`` is a minimal private one, ``/proc`` belongs to a new pid namespace (``bwrap``
is pid 1 there, the command pid 2), and ipc and uts namespaces are new too. The machine's own
directory (its output log lives there) is the one writable place, mounted at
:data:`WORKDIR` and used as the working directory; the agent's other machine directories are
hidden. With ``network=False`` the machine gets a network namespace of its own with only ``lo``.

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
from pathlib import Path

__all__ = ["WORKDIR", "available", "bwrap_argv"]

WORKDIR = "/run/souq"


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
    workdir: Path, *, network: bool, machines_root: Path | None, bwrap: str = "bwrap"
) -> list[str]:
    """The ``bwrap`` command line that jails whatever follows it (append the command)."""
    argv = [
        bwrap,
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",  # noqa: S108 - a private, empty /tmp inside the sandbox
        "--tmpfs", "/run",
    ]  # fmt: skip
    hidden = ("/tmp", "/run")  # noqa: S108 - already private inside the sandbox
    if machines_root is not None and not any(machines_root.is_relative_to(h) for h in hidden):
        argv += ["--tmpfs", str(machines_root)]  # other machines' files stay out of sight
    argv += [
        "--bind", str(workdir), WORKDIR,
        "--chdir", WORKDIR,
        "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--hostname", "sandbox",
    ]  # fmt: skip
    if not network:
        argv.append("--unshare-net")
    argv.append("--")
    return argv
