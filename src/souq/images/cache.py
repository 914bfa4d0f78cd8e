"""A worker's image cache: each layer blob pulled once, each image unpacked once, shared by
every machine of that image, evicted least recently used within a size limit.

On disk, under ``root``::

    blobs/sha256/<hex>          each layer as pulled (content-addressed: images that share a
                                layer share the file), checked against its digest
    images/<hex>/rootfs         an image's files: its layers applied in order (whiteouts too);
                                a machine of the image runs in this directory
    index.json                  what is complete: each image's record, its size and when it
                                was last used

What is not in the index (a pull or an unpack cut short by a crash) is removed when the cache
is opened, so a half-written image never runs. Pulls of one image by several machines at once
share one pull (:meth:`ImageCache.ensure`). An image in use by a machine (:meth:`pin`) is never
evicted; others go oldest use first while the cache is over ``limit_bytes``.

An image may use the whole cache, no more: its layers' blobs and its files together; and the
images unpacking at once share the cache's bound. Their files are counted as they are written
(:class:`souq.images.layers.Budget`, :class:`~souq.images.layers.Pool`), so an image that
unpacks past that (a small layer that inflates to gigabytes) stops there, its work directory
and the blobs fetched for it are removed, and the pull fails with ``image_too_large`` naming
the bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from souq.errors import ImageInvalid
from souq.images.layers import Budget, Pool, unpack_layer
from souq.images.stream import LayerStream
from souq.model.image import ImageRecord

__all__ = ["CacheStats", "ImageCache"]

# Fetch a blob by digest, handing its bytes to the sink chunk by chunk, in order (the
# cluster's store: ImageStore.stream).
Fetch = Callable[[str, Callable[[bytes], None]], Awaitable[None]]


@dataclass
class CacheStats:
    pulls: int = 0  # images pulled (some of their layers fetched)
    hits: int = 0  # ensures answered from the cache
    bytes_pulled: int = 0
    evictions: int = 0


@dataclass
class _Entry:
    size: int  # bytes on disk: its rootfs, and its layers' blobs
    record: ImageRecord
    used: int  # the cache's use counter when it was last used (higher is newer)

    @property
    def layers(self) -> list[str]:
        return [layer.digest for layer in self.record.layers]


@dataclass
class ImageCache:
    root: Path
    limit_bytes: int
    fetch: Fetch
    stats: CacheStats = field(default_factory=CacheStats)

    def __post_init__(self) -> None:
        self._images: dict[str, _Entry] = {}
        self._blob_sizes: dict[str, int] = {}
        self._pins: dict[str, int] = {}
        self._pulling: dict[str, asyncio.Future[Path]] = {}
        self._unpacking = Pool(self.limit_bytes)  # what the pulls under way have written
        self._counter = 0
        self._open()

    # -- what the agent asks ---------------------------------------------------------------

    def cached(self) -> list[str]:
        """The references of the images cached here, most recently used first."""
        return sorted(self._images, key=lambda ref: -self._images[ref].used)

    def record(self, reference: str) -> ImageRecord | None:
        """A cached image's record (what it runs, its layers)."""
        entry = self._images.get(reference)
        return None if entry is None else entry.record

    def layer_digests(self) -> list[str]:
        """The digests of every layer held."""
        return list(self._blob_sizes)

    def has_layers(self, record: ImageRecord) -> list[str]:
        """The digests of ``record``'s layers this worker holds already."""
        return [layer.digest for layer in record.layers if layer.digest in self._blob_sizes]

    def bytes_to_pull(self, record: ImageRecord) -> int:
        """What running ``record`` here would fetch (0 when the image is cached)."""
        if record.reference in self._images:
            return 0
        return sum(layer.size for layer in record.layers if layer.digest not in self._blob_sizes)

    def size_bytes(self) -> int:
        return sum(e.size for e in self._images.values())

    def rootfs(self, reference: str) -> Path:
        return self.root / "images" / _hex(reference) / "rootfs"

    def pulling(self, reference: str) -> bool:
        """Whether a pull of the image is under way (another :meth:`ensure` joins it)."""
        return reference in self._pulling

    def use(self, reference: str) -> Path | None:
        """The image's files if it is cached (then it counts as used now), else None."""
        if reference not in self._images:
            return None
        self.stats.hits += 1
        self._touch(reference)
        return self.rootfs(reference)

    async def ensure(self, record: ImageRecord) -> Path:
        """The image's files, pulled and unpacked if they are not here yet (one pull however
        many machines ask at once). Raises ImageInvalid if a blob does not match its digest:
        nothing of it is kept."""
        ref = record.reference
        while True:
            cached = self.use(ref)
            if cached is not None:
                return cached
            running = self._pulling.get(ref)
            if running is None:
                break
            try:
                return await asyncio.shield(running)
            except asyncio.CancelledError:
                if not running.cancelled():
                    raise  # this caller was cancelled
                # the pull it waited on was cancelled with its own caller: pull again
        running = asyncio.get_running_loop().create_future()
        self._pulling[ref] = running
        try:
            path = await self._pull(record)
        except asyncio.CancelledError:
            running.cancel()
            raise
        except Exception as exc:
            running.set_exception(exc)
            running.exception()  # retrieved: the waiters get it, not the loop's handler
            raise
        finally:
            self._pulling.pop(ref, None)
        running.set_result(path)
        return path

    def pin(self, reference: str) -> None:
        """A machine uses the image: it is not evicted until :meth:`unpin`."""
        self._pins[reference] = self._pins.get(reference, 0) + 1
        self._touch(reference)

    def unpin(self, reference: str) -> None:
        left = self._pins.get(reference, 0) - 1
        if left > 0:
            self._pins[reference] = left
        else:
            self._pins.pop(reference, None)
        self.evict()

    def evict(self, *, keep: str | None = None) -> list[str]:
        """Drop unpinned images (and not ``keep``, the one just pulled for a machine), least
        recently used first, while over the limit."""
        gone: list[str] = []
        for ref in sorted(self._images, key=lambda r: self._images[r].used):
            if self.size_bytes() <= self.limit_bytes:
                break
            if self._pins.get(ref) or ref == keep:
                continue
            self._drop(ref)
            gone.append(ref)
        if gone:
            self.stats.evictions += len(gone)
            self._save()
        return gone

    # -- inside ----------------------------------------------------------------------------

    async def _pull(self, record: ImageRecord) -> Path:
        """Each layer in order onto a fresh work directory: one held already is unpacked from
        its blob; one missing is fetched and unpacked as it arrives (:mod:`souq.images.stream`)
        and kept only if its digest matches. The work directory becomes the image's only once
        every layer is in."""
        ref = record.reference
        target = self.root / "images" / _hex(ref)
        work = target.with_name(target.name + ".unpacking")
        rootfs = work / "rootfs"
        await asyncio.to_thread(shutil.rmtree, work, True)
        fetched: list[str] = []
        budget = self._budget(record)
        try:
            for layer in record.layers:
                if layer.digest in self._blob_sizes:
                    path = self._blob_path(layer.digest)
                    await asyncio.to_thread(_unpack_file, path, layer.media_type, rootfs, budget)
                else:
                    await self._fetch_layer(layer.digest, layer.media_type, rootfs, budget)
                    fetched.append(layer.digest)
            await asyncio.to_thread(_install, work, target)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, work, True)
            self._forget_blobs(fetched)  # no image holds them: they would escape the bound
            raise
        finally:
            self._unpacking.give(budget.used)
        if fetched:
            self.stats.pulls += 1
        rootfs_size = await asyncio.to_thread(_tree_size, target)
        self._counter += 1
        self._images[ref] = _Entry(
            size=rootfs_size + sum(layer.size for layer in record.layers),
            record=record,
            used=self._counter,
        )
        self._save()
        self.evict(keep=ref)
        return self.rootfs(ref)

    def _budget(self, record: ImageRecord) -> Budget:
        """What the image's files may take: the cache's bound less its layers' blobs, and,
        with the pulls under way beside it, the cache's bound."""
        return Budget.of(
            self.limit_bytes - record.size,
            f"this worker's image cache ({self.limit_bytes // 2**20} MiB, less the image's "
            f"{record.size} bytes of layers)",
            subject=f"image {record.reference}",
            pool=self._unpacking,
        )

    def _forget_blobs(self, digests: list[str]) -> None:
        used = {d for e in self._images.values() for d in e.layers}
        for digest in digests:
            if digest not in used and self._blob_sizes.pop(digest, None) is not None:
                self._blob_path(digest).unlink(missing_ok=True)

    async def _fetch_layer(
        self, digest: str, media_type: str, rootfs: Path, budget: Budget | None = None
    ) -> int:
        """Fetch one layer and unpack it while it arrives; its blob is kept once its digest
        is checked (ImageInvalid, and nothing kept, when it does not match)."""
        final = self._blob_path(digest)
        partial = final.with_name(f"{final.name}.{secrets.token_hex(4)}.partial")
        stream = LayerStream(partial)
        unpacking = asyncio.get_running_loop().run_in_executor(
            None, stream.unpack, media_type, rootfs, budget
        )
        try:
            await self.fetch(digest, stream.feed)
        finally:
            stream.end()
            done = await asyncio.shield(unpacking)
        if done.digest != digest:
            partial.unlink(missing_ok=True)
            raise ImageInvalid(
                f"layer {digest} does not match its digest: its bytes hash to {done.digest}",
                hint="the image store holds a damaged blob; push the image again",
            )
        if done.error is not None:
            partial.unlink(missing_ok=True)
            raise done.error
        os.replace(partial, final)
        self._blob_sizes[digest] = done.size
        self.stats.bytes_pulled += done.size
        return done.size

    def _drop(self, ref: str) -> None:
        entry = self._images.pop(ref)
        shutil.rmtree(self.root / "images" / _hex(ref), ignore_errors=True)
        still = {d for e in self._images.values() for d in e.layers}
        for digest in entry.layers:
            if digest not in still and digest in self._blob_sizes:
                del self._blob_sizes[digest]
                self._blob_path(digest).unlink(missing_ok=True)

    def _touch(self, ref: str) -> None:
        entry = self._images.get(ref)
        if entry is not None:
            self._counter += 1
            entry.used = self._counter

    def _blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / _hex(digest)

    def _open(self) -> None:
        """Read the index; remove whatever it does not name (work cut short by a crash)."""
        for sub in ("blobs/sha256", "images"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # Machines' users pass through to an image's files by its digest; none lists them.
        for passable in (self.root, self.root / "images"):
            passable.chmod(0o711)
        (self.root / "blobs").chmod(0o700)
        try:
            index = json.loads((self.root / "index.json").read_text())
        except (FileNotFoundError, ValueError):
            index = {"images": {}, "counter": 0}
        for ref, raw in index.get("images", {}).items():
            try:
                record = ImageRecord.model_validate(raw["record"])
            except (KeyError, ValueError):
                continue  # written by an older agent: pulled again when needed
            if self.rootfs(ref).is_dir() and all(
                self._blob_path(x.digest).is_file() for x in record.layers
            ):
                self._images[ref] = _Entry(raw["size"], record, raw["used"])
        self._counter = int(index.get("counter", 0))
        keep_blobs = {_hex(d) for e in self._images.values() for d in e.layers}
        for blob in (self.root / "blobs" / "sha256").iterdir():
            if blob.name in keep_blobs:
                self._blob_sizes["sha256:" + blob.name] = blob.stat().st_size
            else:
                blob.unlink()
        keep_images = {_hex(ref) for ref in self._images}
        for image in (self.root / "images").iterdir():
            if image.name not in keep_images:
                shutil.rmtree(image, ignore_errors=True)

    def _save(self) -> None:
        index = {
            "counter": self._counter,
            "images": {
                ref: {"size": e.size, "used": e.used, "record": e.record.model_dump(mode="json")}
                for ref, e in self._images.items()
            },
        }
        _write_atomically(self.root / "index.json", json.dumps(index).encode())


def _hex(digest: str) -> str:
    return digest.split(":", 1)[1]


def _unpack_file(path: Path, media_type: str, rootfs: Path, budget: Budget | None) -> None:
    with open(path, "rb") as blob:
        unpack_layer(blob, media_type, rootfs, budget=budget)


def _install(work: Path, target: Path) -> None:
    (work / "rootfs").mkdir(parents=True, exist_ok=True)  # an image of no layers
    shutil.rmtree(target, ignore_errors=True)
    os.replace(work, target)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _tree_size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                continue
    return total
