"""The cluster's image store, in what NATS already runs: JetStream's object store holds every
blob once, by its digest (layers shared between images are stored once), and its key-value
store one record per image (:class:`~souq.model.image.ImageRecord`), keyed by the reference's
hex digest, with a second key per name. Replicated as the JetStream streams under it are
(three copies on a NATS cluster of three nodes or more: :func:`souq.bus.jetstream.replicas_for`).

Every blob read back is checked against its digest: a store that returns other bytes is an
error, never an image that runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE, ObjectStore

from souq.bus.jetstream import key_value, object_store, unavailable
from souq.clock import Clock, SystemClock, iso_from_ms
from souq.errors import ImageNotFound, InvalidInput, Unavailable
from souq.images.manifest import Image, record_of, verify_blob
from souq.model.image import ImageRecord

__all__ = ["BLOBS_BUCKET", "RECORDS_BUCKET", "ImageStore"]

BLOBS_BUCKET = "souq-image-blobs"
RECORDS_BUCKET = "souq-images"
CHUNKS_TIMEOUT_S = 30.0  # a blob's read may take this, and a second per 10 MB on top
T = TypeVar("T")
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}(:[A-Za-z0-9._-]{1,128})?")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _blob_key(digest: str) -> str:
    return digest.replace(":", "/")  # object names: sha256/<hex>


def _name_key(name: str) -> str:
    return "name." + name.encode().hex()  # any name, as one valid key token


@dataclass
class ImageStore:
    js: JetStreamContext
    blobs: ObjectStore
    records: KeyValue
    clock: Clock = field(default_factory=SystemClock)

    @classmethod
    async def open(cls, nc: Client) -> ImageStore:
        """Bind to the buckets, creating them on first use."""
        try:
            js = nc.jetstream()
            blobs = await object_store(
                js,
                BLOBS_BUCKET,
                ObjectStoreConfig(
                    description="souq image blobs, by sha256 digest",
                    storage=StorageType.FILE,
                ),
            )
            records = await key_value(
                js,
                RECORDS_BUCKET,
                "souq images: one record per image and per name",
            )
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable("the image store", exc) from exc
        return cls(js, blobs, records)

    async def put(self, image: Image, *, name: str | None = None) -> ImageRecord:
        """Store ``image`` (its blobs that are not stored yet, then its record); under ``name``
        too if given (a later image of the same name takes the name over)."""
        name = name or image.name
        if name is not None and not _NAME.fullmatch(name):
            raise InvalidInput(
                f"name: {name!r} is not an image name",
                hint="lower-case letters, digits, '.', '_' and '-', optionally ':TAG'",
                details={"field": "name"},
            )
        for digest, data in image.blobs.items():
            # Hashing a large layer takes a while: off the event loop (a broker's creates
            # share it).
            await asyncio.to_thread(verify_blob, digest, data)
            if not await self._has_blob(digest):
                await self._guard(self.blobs.put(_blob_key(digest), data))
        record = record_of(image, name=name, created_at=iso_from_ms(self.clock.now_ms()))
        key = image.reference.split(":", 1)[1]
        await self._guard(self.records.put(key, record.model_dump_json().encode()))
        if name is not None:
            await self._guard(self.records.put(_name_key(name), image.reference.encode()))
        return record

    async def record(self, ref: str) -> ImageRecord:
        """The image a reference (``sha256:…``) or a name names; :class:`ImageNotFound` else."""
        reference = ref
        if not _DIGEST.fullmatch(ref):
            named = await self._get(_name_key(ref)) if _NAME.fullmatch(ref) else None
            if named is None:
                hint = "see `souq image list`"
                if "/" not in ref:  # Docker Hub's short form: say how to pull it
                    hint += f"; to pull it from Docker Hub, name it docker.io/library/{ref}"
                raise ImageNotFound(
                    f"no image is named {ref!r} in the cluster's store (a name without a "
                    "registry is looked up there, not on Docker Hub)",
                    hint=hint,
                )
            reference = named.decode()
        value = await self._get(reference.split(":", 1)[1])
        if value is None:
            raise ImageNotFound(
                f"image {ref} is not in the cluster's store",
                hint="build it with `souq image build DIR` or import it with `souq image import`",
            )
        return ImageRecord.model_validate_json(value)

    async def list(self) -> list[ImageRecord]:
        """Every image in the store, newest first."""
        try:
            keys = await self.records.keys()
        except nats.js.errors.NoKeysError:
            return []
        out = []
        for key in keys:
            if key.startswith("name."):
                continue
            value = await self._get(key)
            if value is not None:
                out.append(ImageRecord.model_validate_json(value))
        return sorted(out, key=lambda r: r.created_at, reverse=True)

    async def blob(self, digest: str) -> bytes:
        """A blob's bytes, checked against its digest."""
        parts: list[bytes] = []
        await self.stream(digest, parts.append)
        data = b"".join(parts)
        await asyncio.to_thread(verify_blob, digest, data)
        return data

    async def stream(self, digest: str, sink: Callable[[bytes], None]) -> None:
        """A blob's bytes handed to ``sink`` chunk by chunk, in order, as they arrive (not
        checked: the caller hashes what it keeps, as :mod:`souq.images.stream` does)."""
        try:
            info = await self._guard(self.blobs.get_info(_blob_key(digest)))
        except nats.js.errors.ObjectNotFoundError:
            raise ImageNotFound(f"blob {digest} is not in the cluster's image store") from None
        await self._chunks(info.nuid or "", info.size or 0, sink)

    async def _chunks(self, nuid: str, size: int, sink: Callable[[bytes], None]) -> None:
        """An object's chunks, read with an ordered consumer whose callback hands them on.
        (nats-py's ``ObjectStore.get`` hands each chunk to a thread, or joins them by repeated
        concatenation: 6 to 44 MB/s for 64 MiB here, against 380 or more this way.) The
        subject is the object store's own layout, ``$O.<bucket>.C.<nuid>``."""
        if size == 0:
            return
        got = 0
        done = asyncio.get_running_loop().create_future()

        async def on_chunk(msg: Msg) -> None:
            nonlocal got
            if got >= size:
                return  # a redelivery after the end
            sink(msg.data)
            got += len(msg.data)
            if got >= size and not done.done():
                done.set_result(None)

        subject = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=BLOBS_BUCKET, obj=nuid)
        sub = await self._guard(self.js.subscribe(subject, cb=on_chunk, ordered_consumer=True))
        try:
            async with asyncio.timeout(CHUNKS_TIMEOUT_S + size / 10e6):
                await done
        except TimeoutError:
            raise Unavailable(
                f"the image store sent {got} of {size} bytes in time",
                hint="check that NATS (with JetStream) is up and not overloaded",
            ) from None
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _has_blob(self, digest: str) -> bool:
        with contextlib.suppress(nats.js.errors.ObjectNotFoundError):
            await self._guard(self.blobs.get_info(_blob_key(digest)))
            return True
        return False

    async def _get(self, key: str) -> bytes | None:
        try:
            entry = await self._guard(self.records.get(key))
        except nats.js.errors.KeyNotFoundError:
            return None
        return entry.value

    @staticmethod
    async def _guard(call: Awaitable[T]) -> T:
        try:
            return await call
        except (nats.js.errors.ObjectNotFoundError, nats.js.errors.KeyNotFoundError):
            raise
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise Unavailable(
                f"the image store did not answer: {exc or type(exc).__name__}",
                hint="check that NATS (with JetStream) is up",
            ) from exc
