"""Hostile images for the tenancy tests, made by hand: an image of one given layer (any tar,
safe or not), a gzip bomb, and a large layout written to disk without being held in memory."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

from souq.images import Descriptor, Image
from souq.images.layers import MEDIA_LAYER_GZIP, MEDIA_LAYER_TAR
from souq.images.manifest import (
    MEDIA_CONFIG,
    MEDIA_MANIFEST,
    dumps,
    host_architecture,
    image_from_manifest,
)

CHUNK = 1 << 20


def _config_and_manifest(
    layer: Descriptor, diff_id: str, cmd: list[str]
) -> tuple[bytes, Descriptor, bytes, Descriptor]:
    config = dumps(
        {
            "architecture": host_architecture(),
            "os": "linux",
            "config": {"Cmd": cmd, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    )
    config_desc = Descriptor.of(MEDIA_CONFIG, config)
    manifest = dumps(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": config_desc.to_json(),
            "layers": [layer.to_json()],
        }
    )
    return config, config_desc, manifest, Descriptor.of(MEDIA_MANIFEST, manifest)


def image_of_layer(
    data: bytes, *, media_type: str = MEDIA_LAYER_TAR, diff_id: str | None = None, cmd: list[str]
) -> Image:
    """An image of the one layer ``data`` (any bytes: nothing checks its entries here)."""
    layer = Descriptor.of(media_type, data)
    config, config_desc, manifest, manifest_desc = _config_and_manifest(
        layer, diff_id or layer.digest, cmd
    )
    blobs = {layer.digest: data, config_desc.digest: config, manifest_desc.digest: manifest}
    return image_from_manifest(manifest_desc, lambda d: blobs[d.digest], None)


def layer_tar(add: Callable[[tarfile.TarFile], None]) -> bytes:
    """An uncompressed layer tar holding what ``add`` puts in it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add(tar)
    return out.getvalue()


def add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def add_entry(tar: tarfile.TarFile, name: str, kind: bytes, linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o644
    tar.addfile(info)


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def gzip_bomb(unpacked: int, cmd: list[str]) -> Image:
    """An image whose one gzip layer is small and unpacks to ``unpacked`` bytes of zeros (in one
    file), made as a stream: the zeros are never in memory."""
    raw = io.BytesIO()
    tar_hash = hashlib.sha256()

    class _Tee(io.RawIOBase):
        def __init__(self) -> None:
            super().__init__()
            self.gz = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0)

        def writable(self) -> bool:
            return True

        def write(self, data: bytes) -> int:  # type: ignore[override]
            tar_hash.update(data)
            return self.gz.write(data)

    tee = _Tee()
    with tarfile.open(fileobj=tee, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("zeros")
        info.size, info.mode = unpacked, 0o644
        tar.addfile(info, io.BufferedReader(_Zeros(unpacked), CHUNK))
    tee.gz.close()
    return image_of_layer(
        raw.getvalue(),
        media_type=MEDIA_LAYER_GZIP,
        diff_id="sha256:" + tar_hash.hexdigest(),
        cmd=cmd,
    )


def large_layout(path: Path, size: int, seed: bytes) -> Path:
    """An OCI layout tar at ``path`` whose one uncompressed layer holds a file of ``size``
    bytes (``seed`` first, zeros after: a digest of its own), written a chunk at a time."""
    layer_path = path.with_suffix(".layer")
    with open(layer_path, "wb") as out, tarfile.open(fileobj=out, mode="w|") as tar:
        info = tarfile.TarInfo("data")
        info.size, info.mode = size, 0o644
        body = io.BufferedReader(_Seeded(seed, size), CHUNK)
        tar.addfile(info, body)
    digest, layer_size = _digest_of(layer_path)
    layer = Descriptor(MEDIA_LAYER_TAR, digest, layer_size)
    config, config_desc, manifest, manifest_desc = _config_and_manifest(layer, digest, ["true"])
    index = dumps({"schemaVersion": 2, "manifests": [manifest_desc.to_json()]})
    with tarfile.open(path, "w") as tar:
        small = {
            "oci-layout": dumps({"imageLayoutVersion": "1.0.0"}),
            "index.json": index,
            f"blobs/sha256/{config_desc.digest[7:]}": config,
            f"blobs/sha256/{manifest_desc.digest[7:]}": manifest,
        }
        for name, data in small.items():
            add_file(tar, name, data)
        tar.add(layer_path, arcname=f"blobs/sha256/{digest[7:]}")
    layer_path.unlink()
    return path


class _Seeded(_Zeros):
    def __init__(self, seed: bytes, size: int) -> None:
        super().__init__(size)
        self.seed = seed

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = super().readinto(buffer)
        if self.seed and n:
            k = min(n, len(self.seed))
            buffer[:k] = self.seed[:k]
            self.seed = self.seed[k:]
        return n


def _digest_of(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


def file_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk
