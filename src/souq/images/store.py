"""The cluster's image store, in what NATS already runs: JetStream's object store holds every blob
once, by its digest (layers shared between images are stored once), and its key-value store one
record per image (:class:`~souq.model.image.ImageRecord`), keyed by the reference's hex digest, with
a second key per name, in Docker's normal form (:mod:`souq.images.names`: ``busybox`` and
``docker.io/library/busybox:latest`` are one key), and a third when the name was written with its
registry: only that one answers a create that names the registry, so an app's short name never
stands in for a registry's image. Replicated as the JetStream streams under it are (three copies on
a NATS cluster of three nodes or more: :func:`souq.bus.jetstream.replicas_for`).

**Whose names.** A name is the cluster's (stored with a token of every app: ``name.…``, and
``reg.…`` for a registry's name) or one app's (stored with that app's token: ``app.<app>.…``).
An app's lookup of a name finds its own first, then the cluster's, never another app's; an app
never writes the cluster's keys or another app's. **Who may run an image by its digest.** Each
image has an access key per app that stored it (``acl.<hex>.<app>``), and ``acl.<hex>._`` when
the cluster stored it (every app may run it): an app may run a digest it stored, or one the
cluster stored (so every image a name it may read leads to). An image stored before access keys
existed has none, and stays the cluster's.

**Uploads** are not held in memory: a layer is read from a file (the broker spools the body to
a temporary file) through its digest and its entries' checks
(:func:`souq.images.layers.check_layer`: nothing that would escape the root or make a device),
then copied into the object store in chunks, only once it passed.

Every blob read back is checked against its digest: a store that returns other bytes is an error,
never an image that runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE, ObjectStore

from souq.bus.jetstream import key_value, keys_written, live_keys, object_store, unavailable
from souq.clock import Clock, SystemClock, iso_from_ms
from souq.errors import ImageNotFound, InvalidInput, Unavailable
from souq.images.layers import check_layer
from souq.images.manifest import Descriptor, Image, record_of, verify_blob
from souq.images.names import ImageName, image_name, is_digest
from souq.model.image import ImageRecord

__all__ = ["BLOBS_BUCKET", "CLUSTER", "RECORDS_BUCKET", "ImageStore", "OpenBlob", "not_stored_hint"]

CLUSTER = None  # whose a name or an image is when a token of every app stored it
OpenBlob = Callable[[str], IO[bytes]]  # a blob of an upload, by digest, as a file to read

BLOBS_BUCKET = "souq-image-blobs"
RECORDS_BUCKET = "souq-images"
CHUNKS_TIMEOUT_S = 30.0  # a blob's read may take this, and a second per 10 MB on top
T = TypeVar("T")
# The names the store took before it read names as Docker does: each is still found by its own
# spelling.
_LEGACY_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}(:[A-Za-z0-9._-]{1,128})?")


def _stored_name(name: str) -> ImageName:
    """A name to store an image under, read as Docker reads it (a name with a digest is
    refused: the digest names one image already)."""
    parsed = image_name(name, field="name")
    if parsed.digest is not None:
        raise InvalidInput(
            f"name: {name!r} has a digest, which names one image already",
            hint="store it under a tag, e.g. docker.io/library/busybox:latest",
            details={"field": "name"},
        )
    return parsed


def not_stored_hint(name: ImageName | None) -> str:
    """What to do about a name the store does not hold: store it under that name."""
    hint = "see `souq image list`"
    if name is None:
        return hint
    hint += (
        "; where no registry can be reached, store it under this name: "
        f"`souq image import PATH --name {name.canonical}` (or `souq image pull` from a mirror "
        f"with `--name {name.canonical}`)"
    )
    if not name.registry_given:  # Docker Hub's short form: the store only, never the Hub
        hint += f"; to run it from Docker Hub, write {name.canonical}"
    return hint


def _hex(reference: str) -> str:
    return reference.split(":", 1)[1]  # a record's key: its reference's hex digits


def _blob_key(digest: str) -> str:
    return digest.replace(":", "/")  # object names: sha256/<hex>


def _name_key(name: str) -> str:
    return "name." + name.encode().hex()  # any name, as one valid key token


def _registry_key(name: str) -> str:
    """The key of a name stored as written with its registry: what a create naming that
    registry finds instead of asking it."""
    return "reg." + name.encode().hex()


def _app_name_key(app: str, name: str) -> str:
    """The key of one app's name (app names are DNS labels: valid key tokens)."""
    return f"app.{app}.{name.encode().hex()}"


def _access_key(reference: str, app: str | None) -> str:
    """Who may run the image by its digest: one app (a DNS label), or ``_`` (every app)."""
    return f"acl.{_hex(reference)}.{app or '_'}"


_NOT_RECORDS = ("name.", "reg.", "app.", "acl.")


def _check(source: bytes | IO[bytes], layer: Descriptor) -> None:
    check_layer(source, layer.media_type, layer.digest, layer.size)


def _name_keys(name: ImageName, owner: str | None) -> Iterable[str]:
    """Where ``owner`` stores ``name``: an app's own key, or the cluster's (and its registry
    key, for a registry's name: only the cluster stores one, see souq.broker.image_routes)."""
    if owner is not None:
        yield _app_name_key(owner, name.canonical)
        return
    yield _name_key(name.canonical)
    if name.registry_given:
        yield _registry_key(name.canonical)


@dataclass
class ImageStore:
    js: JetStreamContext
    blobs: ObjectStore
    records: KeyValue
    clock: Clock = field(default_factory=SystemClock)

    @classmethod
    async def open(cls, nc: Client, *, make: bool = True) -> ImageStore:
        """Bind to the buckets, creating them on first use (without ``make``: the ones a broker
        made, as an agent does)."""
        try:
            js = nc.jetstream()
            blobs = await object_store(
                js,
                BLOBS_BUCKET,
                ObjectStoreConfig(
                    description="souq image blobs, by sha256 digest",
                    storage=StorageType.FILE,
                ),
                make=make,
            )
            records = await key_value(
                js, RECORDS_BUCKET, "souq images: one record per image and per name", make=make
            )
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable("the image store", exc) from exc
        return cls(js, blobs, records)

    async def put(
        self,
        image: Image,
        *,
        name: str | None = None,
        owner: str | None = CLUSTER,
        open_blob: OpenBlob | None = None,
    ) -> ImageRecord:
        """Store ``image`` (its blobs that are not stored yet, then its record); under ``name``
        too if given (a later image of the same name takes the name over), in ``owner``'s
        names (an app's, or :data:`CLUSTER`'s). A layer not held in ``image.blobs`` is read
        with ``open_blob`` (an upload's file): checked first, then copied in chunks. Every
        layer's entries are checked (:func:`~souq.images.layers.check_layer`) before it is
        stored."""
        name = name or image.name
        stored = None if name is None else _stored_name(name)
        for layer in image.layers:
            await self._put_layer(layer, image, open_blob)
        for digest, data in image.blobs.items():
            # Hashing a large blob takes a while: off the event loop (a broker's creates
            # share it).
            await asyncio.to_thread(verify_blob, digest, data)
            if not await self._has_blob(digest):
                await self._guard(self.blobs.put(_blob_key(digest), data))
        record = record_of(image, name=name, created_at=iso_from_ms(self.clock.now_ms()))
        # Who may run it first: a record is never readable before its access key.
        await self._guard(self.records.put(_access_key(image.reference, owner), b"1"))
        await self._guard(
            self.records.put(_hex(image.reference), record.model_dump_json().encode())
        )
        if stored is not None:
            for key in _name_keys(stored, owner):
                await self._guard(self.records.put(key, image.reference.encode()))
        return record

    async def _put_layer(self, layer: Descriptor, image: Image, open_blob: OpenBlob | None) -> None:
        """One layer: its bytes checked (digest, size, entries), then stored if new."""
        data = image.blobs.get(layer.digest)
        if data is None and open_blob is None:
            raise InvalidInput(f"layer {layer.digest} is missing from the upload")
        if data is not None:
            await asyncio.to_thread(_check, data, layer)
            return  # stored with the other blobs held in memory
        assert open_blob is not None
        with open_blob(layer.digest) as checked:
            await asyncio.to_thread(_check, checked, layer)
        if await self._has_blob(layer.digest):
            return
        with open_blob(layer.digest) as source:
            await self._guard(self.blobs.put(_blob_key(layer.digest), source))  # type: ignore[arg-type]

    async def record(self, ref: str, *, app: str | None = CLUSTER) -> ImageRecord:
        """The image a reference (``sha256:…``) or a name names, every spelling of a name
        Docker reads as one (:func:`souq.images.names.image_name`), as ``app`` sees the
        store (its own names, then the cluster's; a digest only if it may run it: see the
        module's docstring; :data:`CLUSTER`: the cluster's names, every digest);
        :class:`ImageNotFound` else."""
        reference = ref if is_digest(ref) else await self._named(ref, app)
        # A digest written by the caller (alone, or after a name: NAME@sha256:…) is checked;
        # a name leads only to images its namespace's owner stored.
        checked = app is not None and (is_digest(ref) or "@" in ref)
        value = await self._get(_hex(reference))
        if value is None or (checked and not await self.may_run(str(app), reference)):
            raise ImageNotFound(
                f"image {ref} is not in the cluster's store"
                + ("" if app is None else f" for app {app}"),
                hint="build it with `souq image build DIR` or import it with `souq image "
                "import` (with this app's token, or --app)",
            )
        return ImageRecord.model_validate_json(value)

    async def may_run(self, app: str, reference: str) -> bool:
        """Whether ``app``'s machines may run the image ``reference``: it stored the image,
        the cluster did, or the image predates access keys (it has none)."""
        for who in (app, CLUSTER):
            if await self._get(_access_key(reference, who)) is not None:
                return True
        return not await self._has_access_keys(reference)

    async def _has_access_keys(self, reference: str) -> bool:
        """Whether any app may run the image by its digest, or could: a key of its ``acl.``
        keys written, even one since deleted (asked of the stream, not a watch: a watch can
        end before its first key arrives, which here would open the image to every app)."""
        return bool(await self._guard(keys_written(self.records, f"acl.{_hex(reference)}.*")))

    async def _named(self, ref: str, app: str | None) -> str:
        """The reference stored under the name ``ref``: ``app``'s own, else the cluster's (its
        normal form's key, or, for a name stored before names were normalised, its own)."""
        try:
            name: ImageName | None = image_name(ref)
        except InvalidInput:
            if not _LEGACY_NAME.fullmatch(ref):
                raise
            name = None
        if name is not None and name.digest is not None:
            return name.digest  # the digest names the image: its record, if stored
        keys = []
        if name is not None:
            # A name written with its registry finds only what was stored under such a name
            # (an operator's: see souq.broker.image_routes), never an app's short name.
            if app is not None and not name.registry_given:
                keys.append(_app_name_key(app, name.canonical))
            keys.append((_registry_key if name.registry_given else _name_key)(name.canonical))
        if _LEGACY_NAME.fullmatch(ref):
            keys.append(_name_key(ref))
        for key in keys:
            named = await self._get(key)
            if named is not None:
                return named.decode()
        raise ImageNotFound(
            f"no image is named {ref!r} in the cluster's store"
            + ("" if name is None else f" (as {name.canonical})"),
            hint=not_stored_hint(name),
        )

    async def list(self, *, app: str | None = CLUSTER) -> list[ImageRecord]:
        """Every image in the store (``app``: those its machines may run), newest first, each
        with the name it was stored under only while that name still names it for ``app`` (a
        later image of the name took it over: it is listed without)."""
        keys = await self._keys()
        access: dict[str, set[str]] = {}
        for key in keys:
            if key.startswith("acl."):
                _, hex_, who = key.split(".", 2)
                access.setdefault(hex_, set()).add(who)
        out = []
        for key in keys:
            if key.startswith(_NOT_RECORDS):
                continue
            if app is not None and not {app, "_"} & access.get(key, {"_"}):
                continue
            value = await self._get(key)
            if value is not None:
                record = ImageRecord.model_validate_json(value)
                if (
                    record.name is not None
                    and await self._names(record.name, app) != record.reference
                ):
                    record = record.model_copy(update={"name": None})
                out.append(record)
        return sorted(out, key=lambda r: r.created_at, reverse=True)

    async def _names(self, name: str, app: str | None) -> str | None:
        """The reference ``name`` names now for ``app``, if any."""
        try:
            return await self._named(name, app)
        except (ImageNotFound, InvalidInput):
            return None

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

    async def _keys(self) -> tuple[str, ...]:
        return tuple(await self._guard(live_keys(self.records)))

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
        except (
            nats.js.errors.ObjectNotFoundError,
            nats.js.errors.KeyNotFoundError,
            nats.js.errors.NoKeysError,
        ):
            raise
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise Unavailable(
                f"the image store did not answer: {exc or type(exc).__name__}",
                hint="check that NATS (with JetStream) is up",
            ) from exc
