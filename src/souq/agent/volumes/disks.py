"""A volume's size, enforced: where the agent runs as root and the host has loop devices and
``mkfs.ext4``, a volume is an ext4 filesystem in a sparse file of its size
(``<volumes>/.images/<id>.img``), mounted (``-o loop``) on its directory. A write past the size
fails with "no space left on device", as on a disk of that size. An extend grows the file and the
filesystem: mounted where the kernel allows it (``losetup -c``, ``resize2fs``), else unmounted —
at once when no machine uses the volume, or when its machine next starts (Fly's
``needs_restart``). Elsewhere a volume is a plain directory and only its reservation in the
worker's disk ledger is enforced.

A mount outlives the agent (machines keep running across its restarts); after a reboot the
agent mounts the volume again before a machine uses it (:meth:`VolumeDisks.ready`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

from souq.errors import Unavailable

__all__ = ["VolumeDisks"]

log = logging.getLogger(__name__)

IMAGES = ".images"
_GB = 1024**3


def _run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise Unavailable(
            f"{args[0]} failed: {done.stderr.strip() or done.stdout.strip()}",
            hint="check the worker's disk and loop devices",
        )
    return done.stdout


def _mounted(directory: Path) -> bool:
    return os.path.ismount(directory)


class VolumeDisks:
    """Filesystems of their own for volumes (``enabled``), or nothing to do."""

    def __init__(self, root: Path, *, enabled: bool | None = None) -> None:
        self.root = root
        self.enabled = self.available() if enabled is None else enabled

    @staticmethod
    def available() -> bool:
        """Root, loop devices and the ext4 tools: a volume can have a filesystem of its size."""
        tools = all(shutil.which(t) for t in ("mkfs.ext4", "losetup", "resize2fs", "mount"))
        return os.geteuid() == 0 and tools and Path("/dev/loop-control").exists()

    def image(self, volume_id: str) -> Path:
        return self.root / IMAGES / f"{volume_id}.img"

    def make(self, volume_id: str, directory: Path, size_gb: int) -> None:
        """A filesystem of ``size_gb`` for the volume, mounted on ``directory``."""
        directory.mkdir(parents=True, exist_ok=True, mode=0o755)
        if not self.enabled:
            return
        image = self.image(volume_id)
        image.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(image, "wb") as f:
            f.truncate(size_gb * _GB)  # sparse: the disk is taken as files are written
        _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "root_owner=0:0", str(image))
        self.ready(volume_id, directory)

    def ready(self, volume_id: str, directory: Path) -> None:
        """The volume's filesystem mounted on ``directory`` (again, after a reboot), grown
        first if an extend left it to grow offline (:meth:`grow`)."""
        directory.mkdir(parents=True, exist_ok=True, mode=0o755)
        image = self.image(volume_id)
        if not (self.enabled and image.exists()):
            return
        pending = self._pending(volume_id)
        if pending.exists() and _mounted(directory):
            with contextlib.suppress(Unavailable):  # still in use: it grows at a later start
                _run("umount", str(directory))
        if not _mounted(directory):
            if pending.exists():
                self._resize_offline(image)
                pending.unlink()
            _run("mount", "-o", "loop", str(image), str(directory))
            log.info("volume %s mounted (%s)", volume_id, image)

    def grow(self, volume_id: str, directory: Path, size_gb: int, *, in_use: bool) -> bool:
        """Grow the file and the filesystem to ``size_gb``. Mounted, where the kernel allows
        it; else at once unmounted when nothing uses the volume, or at its machine's next start
        (``True``: it needs one)."""
        image = self.image(volume_id)
        if not (self.enabled and image.exists()):
            return False
        self.ready(volume_id, directory)
        with open(image, "r+b") as f:
            f.truncate(size_gb * _GB)
        device = self._device(image)
        _run("losetup", "-c", device)
        try:
            _run("resize2fs", device)
            if self._size_of(directory) >= self._size_of_image(image) * 0.9:
                return False
        except Unavailable as exc:
            log.info("volume %s cannot grow mounted: %s", volume_id, exc)
        self._pending(volume_id).touch()
        if in_use:
            return True
        self.ready(volume_id, directory)  # unmounted, grown, mounted again
        return False

    def _pending(self, volume_id: str) -> Path:
        return self.root / IMAGES / f"{volume_id}.grow"

    @staticmethod
    def _resize_offline(image: Path) -> None:
        _run("e2fsck", "-f", "-p", str(image))
        _run("resize2fs", str(image))

    @staticmethod
    def _size_of(directory: Path) -> int:
        stat = os.statvfs(directory)
        return stat.f_blocks * stat.f_frsize

    @staticmethod
    def _size_of_image(image: Path) -> int:
        return image.stat().st_size

    def remove(self, volume_id: str, directory: Path) -> None:
        """Unmount the volume's filesystem and delete it (its directory is the caller's)."""
        self.unmount(directory)
        self.image(volume_id).unlink(missing_ok=True)
        self._pending(volume_id).unlink(missing_ok=True)

    @staticmethod
    def unmount(directory: Path) -> None:
        if _mounted(directory):
            _run("umount", str(directory))

    @staticmethod
    def _device(image: Path) -> str:
        """The loop device the image is attached to."""
        found = _run("losetup", "-j", str(image)).split(":", 1)[0].strip()
        if not found:
            raise Unavailable(f"{image} is not attached to a loop device")
        return found
