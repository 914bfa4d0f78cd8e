"""A cluster whose agent runs as root with its own defaults (a uid per machine, the sandbox
where the host can), kept under /var/tmp mode 0711: not under pytest's base (0700, root's),
since each machine's uid must reach its directory, as under `souq dev`'s /var/lib/souq/dev."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from souq.drivers import rootfs
from souq.testing import Cluster


@contextmanager
def machines_root(prefix: str) -> Iterator[Path]:
    """A directory under /var/tmp, mode 0711 (each machine's uid reaches its own directory),
    removed afterwards with whatever its agents left mounted in it taken down first (an agent
    that leaves its machines be keeps their volumes and roots mounted)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    root.chmod(0o711)
    try:
        yield root
    finally:
        rootfs.unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def isolated_cluster(prefix: str) -> Iterator[Cluster]:
    with machines_root(prefix) as root, Cluster(root, regions={}) as c:
        c.add_agent("mad", machine_user=None, default_driver=None)
        c.wait_for_workers()
        yield c
