"""The host's mount table, as the isolation benchmark (``bench/isolation.py``) grows it: a mount
namespace of its own (``unshare -m``, private) holding ``extra`` tmpfs mounts more than the
host's, which a runtime is started from with ``nsenter -m``.

Each running machine of an image adds two mounts to the host's table (its root and its
idmapped lower layer, :mod:`souq.drivers.rootfs`), and every new mount namespace starts as a
copy of the table it is made from; so a start is timed from tables as large as hundreds of
machines would make them, without touching the host's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType

from souq.procs import terminate
from souq.testing import wait_until

__all__ = ["MountTable"]

_MOUNT = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
base, count = sys.argv[1], int(sys.argv[2])
for i in range(count):
    path = os.path.join(base, str(i))
    os.makedirs(path, exist_ok=True)
    if libc.mount(b"tmpfs", path.encode(), b"tmpfs", 0, b"size=4k") != 0:
        raise OSError(ctypes.get_errno(), "mount " + path)
"""


class MountTable:
    """A mount namespace with ``extra`` mounts more than this process's (under ``base``)."""

    def __init__(self, base: Path, extra: int) -> None:
        self.extra = extra
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sleep", "infinity"]
        )
        own = os.readlink("/proc/self/ns/mnt")
        ns = f"/proc/{self.holder.pid}/ns/mnt"
        wait_until(
            lambda: os.readlink(ns) != own and _comm(self.holder.pid) == "sleep",
            timeout=10,
            interval=0.005,
            message="the mount namespace",
        )
        if extra:
            code = [sys.executable, "-c", _MOUNT, str(base), str(extra)]
            subprocess.run([*self.enter(), *code], check=True)
        with open(f"/proc/{self.holder.pid}/mountinfo") as f:
            self.mounts = sum(1 for _ in f)  # the whole table, as a runtime started in it sees

    def enter(self, uid: int | None = None) -> list[str]:
        """The command prefix that runs what follows in this table (as ``uid``)."""
        prefix = ["nsenter", "--target", str(self.holder.pid), "--mount"]
        if uid is not None:
            prefix += ["--setuid", str(uid), "--setgid", str(uid)]
        return [*prefix, "--"]

    def close(self) -> None:
        """The namespace, and its mounts, end with its last process."""
        terminate(self.holder, timeout=10)

    def __enter__(self) -> MountTable:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
