"""The worker's image cache on real files: one pull per image however many ask, digests
checked, layers shared, least recently used evicted within the limit, pinned images kept, and
the cache as it was after a restart (work cut short by a crash removed)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from souq.errors import ImageInvalid
from souq.images import Image, pack_directory
from souq.images.cache import ImageCache
from souq.images.manifest import record_of
from souq.model.image import ImageRecord


class Store:
    """The cluster's store as the cache sees it: blobs by digest, each fetch counted."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.fetched: Counter[str] = Counter()
        self.gate: asyncio.Event | None = None

    def add(self, image: Image) -> ImageRecord:
        self.blobs.update(image.blobs)
        return record_of(image)

    async def fetch(self, digest: str, sink: Callable[[bytes], None]) -> None:
        """The blob in chunks of 4 kB, as the store streams it."""
        self.fetched[digest] += 1
        if self.gate is not None:
            await self.gate.wait()
        data = self.blobs[digest]
        for at in range(0, len(data), 4096):
            sink(data[at : at + 4096])
            await asyncio.sleep(0)


def make_image(tmp: Path, name: str, size: int = 1000) -> Image:
    src = tmp / f"src-{name}"
    src.mkdir()
    (src / "app.txt").write_text(name)
    (src / "data.bin").write_bytes(name.encode() * (size // len(name)))
    return pack_directory(src, cmd=["cat", "app.txt"])


def test_concurrent_ensures_pull_once_and_share_the_files(tmp_path: Path) -> None:
    store = Store()
    rec = store.add(make_image(tmp_path, "web"))
    cache = ImageCache(tmp_path / "cache", limit_bytes=10**9, fetch=store.fetch)

    async def main() -> list[Path]:
        store.gate = asyncio.Event()
        tasks = [asyncio.create_task(cache.ensure(rec)) for _ in range(8)]
        await asyncio.sleep(0)
        store.gate.set()
        return await asyncio.gather(*tasks)

    roots = asyncio.run(main())
    assert len(set(roots)) == 1
    assert (roots[0] / "app.txt").read_text() == "web"
    assert all(n == 1 for n in store.fetched.values())
    assert cache.stats.pulls == 1
    assert cache.stats.bytes_pulled == rec.size
    assert cache.cached() == [rec.reference]
    assert cache.bytes_to_pull(rec) == 0
    asyncio.run(cache.ensure(rec))
    assert cache.stats.hits == 1


def test_a_blob_that_does_not_match_its_digest_is_never_cached(tmp_path: Path) -> None:
    store = Store()
    rec = store.add(make_image(tmp_path, "bad"))
    digest = rec.layers[0].digest
    store.blobs[digest] = store.blobs[digest][:-1] + bytes([store.blobs[digest][-1] ^ 1])
    cache = ImageCache(tmp_path / "cache", limit_bytes=10**9, fetch=store.fetch)
    with pytest.raises(ImageInvalid, match=digest.split(":")[1][:12]):
        asyncio.run(cache.ensure(rec))
    assert cache.cached() == []
    assert cache.has_layers(rec) == []
    assert not list((tmp_path / "cache" / "images").iterdir())
    assert not list((tmp_path / "cache" / "blobs" / "sha256").iterdir())  # nor its bytes


def test_least_recently_used_goes_first_and_a_pinned_image_stays(tmp_path: Path) -> None:
    store = Store()
    recs = {n: store.add(make_image(tmp_path, n, size=40_000)) for n in ("a", "b", "c")}
    probe = ImageCache(tmp_path / "probe", limit_bytes=10**9, fetch=store.fetch)
    asyncio.run(probe.ensure(recs["a"]))
    one = probe.size_bytes()  # what one of these images takes on disk
    cache = ImageCache(tmp_path / "cache", limit_bytes=int(2.5 * one), fetch=store.fetch)
    asyncio.run(cache.ensure(recs["a"]))
    asyncio.run(cache.ensure(recs["b"]))
    asyncio.run(cache.ensure(recs["a"]))  # a is now newer than b
    asyncio.run(cache.ensure(recs["c"]))  # over the limit: b, the least recently used, goes
    assert set(cache.cached()) == {recs["a"].reference, recs["c"].reference}
    assert cache.stats.evictions == 1
    assert not cache.rootfs(recs["b"].reference).exists()
    assert cache.size_bytes() <= cache.limit_bytes

    cache.pin(recs["c"].reference)
    cache.pin(recs["a"].reference)
    asyncio.run(cache.ensure(recs["b"]))  # nothing may go while both are in use
    assert len(cache.cached()) == 3
    cache.unpin(recs["a"].reference)  # a is free again: the oldest unpinned goes
    assert recs["a"].reference not in cache.cached()
    assert recs["c"].reference in cache.cached()


def test_images_that_share_a_layer_fetch_it_once(tmp_path: Path) -> None:
    store = Store()
    image = make_image(tmp_path, "shared")
    one = store.add(image)
    other = one.model_copy(update={"reference": "sha256:" + "1" * 64})
    cache = ImageCache(tmp_path / "cache", limit_bytes=10**9, fetch=store.fetch)
    asyncio.run(cache.ensure(one))
    assert cache.has_layers(other) == [layer.digest for layer in other.layers]
    assert cache.bytes_to_pull(other) == 0
    asyncio.run(cache.ensure(other))
    assert all(n == 1 for n in store.fetched.values())


def test_the_cache_survives_a_restart_and_drops_half_done_work(tmp_path: Path) -> None:
    store = Store()
    rec = store.add(make_image(tmp_path, "keep"))
    root = tmp_path / "cache"
    asyncio.run(ImageCache(root, limit_bytes=10**9, fetch=store.fetch).ensure(rec))
    # A crash in the middle of another pull leaves an unpacking directory and a stray blob.
    (root / "images" / ("f" * 64 + ".unpacking")).mkdir()
    (root / "blobs" / "sha256" / ("e" * 64)).write_bytes(b"partial")
    again = ImageCache(root, limit_bytes=10**9, fetch=store.fetch)
    assert again.cached() == [rec.reference]
    assert (again.rootfs(rec.reference) / "app.txt").read_text() == "keep"
    assert not (root / "images" / ("f" * 64 + ".unpacking")).exists()
    assert not (root / "blobs" / "sha256" / ("e" * 64)).exists()
    asyncio.run(again.ensure(rec))
    assert sum(store.fetched.values()) == len(rec.layers)  # nothing fetched again
