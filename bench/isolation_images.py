"""The images of ``bench isolation``: a whole root of busybox alone, and the same with 100 MB
more in 1,000 files, built here and put in the cluster's store (the agents pull them)."""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import nats

from souq.images import Image, pack_directory
from souq.images.store import ImageStore

__all__ = ["BUSYBOX", "Images", "busybox_root", "images"]

LARGE_FILES, LARGE_FILE_BYTES = 1000, 100_000  # 100 MB in 1,000 files
BUSYBOX = shutil.which("busybox") or "/bin/busybox"  # busybox-static: the image's only program
APPLETS = ("sh", "sleep", "true")


def busybox_root(root: Path, extra: int = 0) -> Path:
    """A whole root file system of busybox alone (its applets, and the mount points a runtime
    mounts on), with ``extra`` files of random bytes under /data."""
    for d in ("bin", "etc", "proc", "dev", "sys", "tmp"):
        (root / d).mkdir(parents=True, mode=0o755)
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    for i in range(extra):
        sub = root / "data" / f"{i // 100:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"{i:04d}.bin").write_bytes(os.urandom(LARGE_FILE_BYTES))
    return root


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@dataclass(frozen=True)
class Images:
    """The images of the run: busybox alone, and with 100 MB more; their files on this host."""

    small_root: Path
    small: Image
    large: Image
    sizes: dict[str, dict[str, int]]


def images(root: Path, nats_url: str) -> Images:
    """Both images built and put in the cluster's store (the agents pull them from there)."""
    small_root = busybox_root(root / "images" / "busybox")
    large_root = busybox_root(root / "images" / "busybox-100mb", extra=LARGE_FILES)
    small, large = pack_directory(small_root), pack_directory(large_root)

    async def push() -> None:
        nc = await nats.connect(nats_url)
        try:
            store = await ImageStore.open(nc)
            await store.put(small)
            await store.put(large)
        finally:
            await nc.close()

    asyncio.run(push())
    sizes = {
        name: {"layer_bytes": image.layers_size, "files_bytes": _size(files)}
        for name, image, files in (
            ("busybox", small, small_root),
            ("busybox + 100 MB", large, large_root),
        )
    }
    return Images(small_root, small, large, sizes)
