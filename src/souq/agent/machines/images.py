"""The worker's images: its cache (:mod:`souq.images.cache`) as the agent uses it.

* Offers and heartbeats say what the cache holds: the images, and every layer by its short
  digest, so that a broker can tell how much a worker would pull for an image.
* A claim for a machine of an image notes, in the machine's placement record, whether the image
  was cached here and how many bytes are missing, and pins the image (a machine's image is never
  evicted); the machine's destruction unpins it. At an agent restart every machine not destroyed
  pins its image again.
* A spawn whose image is not cached waits for :meth:`AgentImages.pull`, which fetches from the
  cluster's store (JetStream, once the agent is on the bus), checks every digest and unpacks;
  machines that want the same image at once share one pull.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nats.aio.client import Client

from souq.bus.jetstream import OnFirstUse
from souq.images.cache import ImageCache
from souq.images.store import ImageStore
from souq.model.image import ImageRecord
from souq.model.placement import ImagePull, Placement
from souq.placement.request import WantedImage, short_digest

__all__ = ["AgentImages", "Pulled", "image_of", "image_source"]


@dataclass(frozen=True)
class Pulled:
    rootfs: Path
    record: ImageRecord
    bytes_pulled: int
    ms: float


def image_of(placement: Placement | None) -> str | None:
    """The reference of the image a machine runs, as its claim resolved it."""
    return None if placement is None or placement.image is None else placement.image.reference


def image_source(placement: Placement | None) -> str | None:
    """The registry a machine's image is pulled from (none: the cluster's store)."""
    return None if placement is None or placement.image is None else placement.image.source


class AgentImages:
    def __init__(self, root: Path, *, limit_mb: int) -> None:
        self.cache = ImageCache(root, limit_mb * 2**20, fetch=self._fetch)
        self._records: dict[str, ImageRecord] = {}  # from claims: not cached yet, maybe
        self._sources: dict[str, str] = {}  # layer digest -> the registry reference it is in
        self._client: Client | None = None
        self._attached: asyncio.Event | None = None
        self._store = OnFirstUse(self._open_store)
        # Told when what the cache holds changed (an image pulled or evicted): the worker
        # says so in a heartbeat at once, so that placement sees it.
        self.on_change: Callable[[], None] = lambda: None

    # -- what the worker says --------------------------------------------------------------

    def images(self) -> list[str]:
        return self.cache.cached()

    def layers(self) -> list[str]:
        """Short digests of the layers held (what heartbeats carry)."""
        return [short_digest(d) for d in self.cache.layer_digests()]

    def terms(self, reference: str | None, layers: dict[str, int]) -> tuple[int | None, int | None]:
        """An offer's image terms: (layers held, bytes to pull) for the image, or (None, None)
        without one; reckoned as the brokers' book reckons them from heartbeats."""
        if reference is None:
            return None, None
        wanted = WantedImage(reference, tuple(layers.items()))
        cached = self.cache.record(reference) is not None
        return wanted.missing(set(self.layers()), cached=cached)

    # -- machines --------------------------------------------------------------------------

    def claimed(self, record: ImageRecord, placement: Placement) -> Placement:
        """A machine of ``record`` is claimed here: its placement record says what is cached
        (the executor pins the image once the machine is recorded)."""
        self._know(record)
        cached = self.cache.record(record.reference) is not None
        pull = ImagePull(
            reference=record.reference,
            source=record.source,
            layers=len(record.layers),
            layers_cached=len(record.layers) if cached else len(self.cache.has_layers(record)),
            bytes_to_pull=self.cache.bytes_to_pull(record),
        )
        return placement.model_copy(update={"cached": cached, "image": pull})

    def pin(self, reference: str) -> None:
        self.cache.pin(reference)

    def repin(self, old: str | None, new: str | None) -> None:
        """A machine's image changed (an update): pin the new one, release the old one."""
        if old != new:
            if new is not None:
                self.pin(new)
            if old is not None:
                self.release(old)

    def release(self, reference: str) -> None:
        """A machine of the image is gone."""
        before = self.cache.stats.evictions
        self.cache.unpin(reference)
        if self.cache.stats.evictions != before:
            self.on_change()

    def ready(self, reference: str) -> tuple[Path, ImageRecord] | None:
        """The image's files and record if it is cached (and marked used)."""
        record = self.cache.record(reference)
        rootfs = self.cache.use(reference)
        if record is None or rootfs is None:
            return None
        return rootfs, record

    def held(self, reference: str) -> tuple[Path, ImageRecord] | None:
        """The files and record of a cached image, as :meth:`ready` gives them, without
        counting a use (a running machine's image, looked at)."""
        record = self.cache.record(reference)
        return None if record is None else (self.cache.rootfs(reference), record)

    async def pull(self, reference: str, source: str | None = None) -> Pulled:
        """Fetch, check and unpack the image (one pull for every machine waiting on it), from
        the cluster's store or its ``source`` registry. Raises ImageInvalid on a digest
        mismatch, ImageNotFound if the store or the registry lost it."""
        started = time.monotonic()
        record = self._records.get(reference)
        if record is None:  # after an agent restart: the claim's record is gone
            if source is not None:
                from souq.images import registry  # httpx: loaded only for registry images

                record = await asyncio.to_thread(registry.describe_record, source)
            else:
                record = await (await self._store.get()).record(reference)
            self._know(record)
        # A machine that joins another's pull fetches nothing itself: it only waits.
        missing = 0 if self.cache.pulling(reference) else self.cache.bytes_to_pull(record)
        rootfs = await self.cache.ensure(record)
        self.on_change()
        return Pulled(rootfs, record, missing, (time.monotonic() - started) * 1000)

    # -- the cluster's store ---------------------------------------------------------------

    def attach(self, client: Client) -> None:
        """The agent is on the bus: pulls may start."""
        self._client = client
        self._attached_event().set()

    def _attached_event(self) -> asyncio.Event:
        if self._attached is None:
            self._attached = asyncio.Event()
        return self._attached

    async def _open_store(self) -> ImageStore:
        await self._attached_event().wait()
        assert self._client is not None
        return await ImageStore.open(self._client, make=False)  # a broker makes it

    def _know(self, record: ImageRecord) -> None:
        self._records[record.reference] = record
        if record.source is not None:
            for layer in record.layers:
                self._sources[layer.digest] = record.source

    async def _fetch(self, digest: str, sink: Callable[[bytes], None]) -> None:
        source = self._sources.get(digest)
        if source is not None:
            from souq.images import registry  # httpx: loaded only for registry images

            await registry.stream_blob(registry.parse_reference(source), digest, sink)
        else:
            await (await self._store.get()).stream(digest, sink)
