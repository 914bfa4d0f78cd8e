"""What Souq keeps in JetStream shares: a key-value bucket made (or bound to) on first use, the
error it raises when JetStream is not there, and a store opened once however many ask at once.
The image store (:mod:`souq.images.store`) and the release store
(:mod:`souq.broker.releases`) are built on them.

Copies: on a NATS cluster of three nodes or more, every stream Souq makes keeps three (the loss
of one node loses nothing, and its streams' leaders move to the others within seconds); on a
lone server, one. ``SOUQ_NATS_REPLICAS`` overrides it (1 to 5). A stream made earlier with fewer
copies (the cluster grew from one server) is given more when a daemon opens it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable
from typing import ClassVar, Generic, Self, TypedDict, TypeVar, Unpack

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import KeyValueConfig, ObjectStoreConfig, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from souq.bus.transport import cancellation_kept
from souq.clock import Clock, SystemClock
from souq.errors import InvalidInput, Unavailable

__all__ = [
    "REPLICAS_ENV",
    "BucketOptions",
    "BucketStore",
    "BucketWatch",
    "OnFirstUse",
    "key_value",
    "keys_written",
    "live_keys",
    "object_store",
    "open_key_value",
    "reconnects",
    "replicas_for",
    "stream",
    "unavailable",
]

T = TypeVar("T")
log = logging.getLogger(__name__)
REPLICAS_ENV = "SOUQ_NATS_REPLICAS"
_STREAM_NAME_IN_USE = 10058  # JetStream: the stream exists with another configuration
_MAX_REPLICAS = 5


def replicas_for(nc: Client) -> int:
    """How many copies a new stream keeps: ``SOUQ_NATS_REPLICAS`` if set, else 3 when the
    client knows three nodes or more of its cluster (named by the server it is connected to,
    or given to it), else 1."""
    raw = os.environ.get(REPLICAS_ENV, "").strip()
    if raw:
        if not raw.isdigit() or not 1 <= int(raw) <= _MAX_REPLICAS:
            raise InvalidInput(
                f"{REPLICAS_ENV}={raw!r} is not a number of copies",
                hint=f"set it to 1 ... {_MAX_REPLICAS}, or unset it",
            )
        return int(raw)
    # The server's INFO lists the client URLs of its cluster's nodes (itself included), but
    # only those up when the client last connected: after a node's loss, two of three. The
    # client's pool keeps every node it was given or told of, the lost one included; so the
    # larger of the two counts, lest a stream made while a node is down keep one copy.
    listed = len(nc._server_info.get("connect_urls") or ())
    pooled = len({(url.hostname, url.port) for url in nc.servers})
    return 3 if max(listed, pooled) >= 3 else 1


async def _made(
    js: JetStreamContext,
    name: str,
    replicas: int,
    create: Callable[[], Awaitable[T]],
    bind: Callable[[], Awaitable[T]],
) -> T:
    """``create()`` the stream ``name``; if it exists with another configuration, give it
    ``replicas`` copies if it has fewer, and ``bind()`` to it."""
    try:
        return await create()
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != _STREAM_NAME_IN_USE:
            raise
    info = await js.stream_info(name)
    if (info.config.num_replicas or 1) < replicas:
        log.warning(
            "stream %s has %s copies; giving it %d", name, info.config.num_replicas, replicas
        )
        await js.update_stream(dataclasses.replace(info.config, num_replicas=replicas))
    return await bind()


async def stream(js: JetStreamContext, config: StreamConfig) -> None:
    """The stream (made on first use), with :func:`replicas_for` copies."""
    replicas = replicas_for(js._nc)
    config = dataclasses.replace(config, num_replicas=replicas)
    name = config.name or ""

    async def create() -> None:
        await js.add_stream(config)

    async def bind() -> None:
        return None

    await _made(js, name, replicas, create, bind)


async def object_store(
    js: JetStreamContext, bucket: str, config: ObjectStoreConfig, *, make: bool = True
) -> ObjectStore:
    """The object store (made on first use), with :func:`replicas_for` copies; without
    ``make``, the one a broker made (an agent's: it may not make a store)."""
    if not make:
        return await js.object_store(bucket)
    replicas = replicas_for(js._nc)
    config = dataclasses.replace(config, replicas=replicas)

    async def create() -> ObjectStore:
        return await js.create_object_store(bucket, config=config)

    async def bind() -> ObjectStore:
        return await js.object_store(bucket)

    return await _made(js, f"OBJ_{bucket}", replicas, create, bind)


def unavailable(what: str, exc: BaseException) -> Unavailable:
    """``what`` (a store) did not answer: NATS is down, or runs without JetStream."""
    return Unavailable(
        f"{what} is not available: {exc or type(exc).__name__}",
        hint="NATS must run with JetStream enabled (nats-server --jetstream)",
    )


class BucketOptions(TypedDict, total=False):
    """How :func:`key_value` opens a bucket: its keyword arguments, as a caller hands them on."""

    make: bool
    history: int
    ttl_s: float | None


async def key_value(
    js: JetStreamContext,
    bucket: str,
    description: str,
    *,
    make: bool = True,
    history: int = 1,
    ttl_s: float | None = None,
) -> KeyValue:
    """The bucket (made on first use: file storage, ``history`` values kept per key (one by
    default), each kept ``ttl_s`` seconds (forever by default), :func:`replicas_for` copies);
    without ``make``, the one a broker made (an agent's: it may not make a store, whose
    subjects would be its to choose)."""
    if not make:
        return await js.key_value(bucket)
    replicas = replicas_for(js._nc)
    config = KeyValueConfig(
        bucket=bucket,
        description=description,
        storage=StorageType.FILE,
        replicas=replicas,
        history=history,
        ttl=ttl_s,
    )

    async def create() -> KeyValue:
        return await js.create_key_value(config=config)

    async def bind() -> KeyValue:
        return await js.key_value(bucket)

    return await _made(js, f"KV_{bucket}", replicas, create, bind)


async def open_key_value(
    nc: Client,
    bucket: str,
    description: str,
    *,
    what: str,
    timeout_s: float = 5.0,
    **options: Unpack[BucketOptions],
) -> KeyValue:
    """The bucket of ``what`` (a store), as :func:`key_value` makes it with ``options`` (or,
    without ``make``, finds it), each of its requests waiting ``timeout_s`` for JetStream's
    answer; :func:`unavailable` when NATS does not answer or runs without JetStream."""
    try:
        js = nc.jetstream(timeout=timeout_s)
        return await key_value(js, bucket, description, **options)
    except (nats.errors.Error, nats.js.errors.Error) as exc:
        raise unavailable(what, exc) from exc


async def keys_written(kv: KeyValue, pattern: str = ">") -> list[str]:
    """The keys matching ``pattern`` (NATS wildcards) whose subject holds a message, a value
    or a delete marker: one request, answered by the stream itself (no watch), sorted."""
    prefix = kv._pre  # "$KV.<bucket>.": the subject of every key
    info = await kv._js.stream_info(kv._stream, subjects_filter=f"{prefix}{pattern}")
    return sorted(subject[len(prefix) :] for subject in info.state.subjects or {})


async def live_keys(kv: KeyValue) -> list[str]:
    """Every key of the bucket that holds a value (none when it is empty).

    ``kv.keys()`` alone can answer "no keys" for a bucket that has them: its watch decides it
    is empty when the consumer's info counts nothing pending and nothing received, and a busy
    client can have every key delivered but not yet read at that moment. So an empty answer is
    checked against the stream's own list of subjects (one request), keeping those whose last
    message is a value rather than a delete marker."""
    try:
        return await kv.keys()
    except nats.js.errors.NoKeysError:
        pass
    keys = []
    for key in await keys_written(kv):
        try:
            await kv.get(key)
        except nats.js.errors.KeyNotFoundError:  # deleted or purged: its marker is all there is
            continue
        keys.append(key)
    return keys


class BucketStore:
    """A store of records in one key-value bucket, ``BUCKET``, with a clock for their times:
    ``WHAT`` is how its errors name it (:func:`unavailable`)."""

    BUCKET: ClassVar[str]
    DESCRIPTION: ClassVar[str]
    WHAT: ClassVar[str]
    TTL_S: ClassVar[float | None] = None  # how long a value is kept (None: for ever)
    TIMEOUT_S: ClassVar[float] = 5.0  # how long a request waits for JetStream's answer

    def __init__(self, kv: KeyValue, clock: Clock | None = None) -> None:
        self._kv = kv
        self._clock = clock or SystemClock()

    @property
    def bucket(self) -> KeyValue:
        return self._kv

    @classmethod
    async def open(cls, nc: Client) -> Self:
        """The store, its bucket made on first use (:func:`open_key_value`)."""
        kv = await open_key_value(
            nc, cls.BUCKET, cls.DESCRIPTION, what=cls.WHAT, ttl_s=cls.TTL_S, timeout_s=cls.TIMEOUT_S
        )
        return cls(kv)

    async def _keys(self) -> list[str]:
        """Every key of the bucket (none when it is empty)."""
        try:
            return await live_keys(self._kv)
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(self.WHAT, exc) from exc


class OnFirstUse(Generic[T]):
    """A store opened by ``open`` when first asked for, once, however many ask at once; a
    failed opening is tried again by the next ask."""

    def __init__(self, open: Callable[[], Awaitable[T]]) -> None:
        self._open = open
        self._value: T | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> T:
        if self._value is None:
            async with self._lock:
                if self._value is None:
                    self._value = await self._open()
        return self._value


def reconnects(client: Client) -> int:
    """How many times ``client`` reconnected (what a :class:`BucketWatch` compares)."""
    return int(client.stats["reconnects"])


class BucketWatch:
    """A watch of a key-value bucket that keeps running: each entry (a put, a delete) to
    ``on_entry``, the end of the first pass over what the bucket holds to ``on_synced``, and
    ``on_lost`` when the watch stops (NATS down, no JetStream, no bucket yet), after which it
    starts again ``retry_s`` later, from the bucket's present values. ``meta_only``: keys and
    operations, no values. ``include_history``: the first pass gives every value the bucket
    keeps of each key (its ``history``), oldest first, not only the latest.

    A watch that outlives a reconnection of its connection delivers nothing more (its ordered
    consumer is gone with the server's state), and says nothing of it: so every ``check_s`` an
    idle watch compares ``reconnects()`` (the connection's count, :func:`reconnects`) with the
    count it started at, and starts again, at once, when it moved."""

    def __init__(
        self,
        bucket: Callable[[], Awaitable[KeyValue]],
        on_entry: Callable[[KeyValue.Entry], None],
        *,
        name: str,
        on_synced: Callable[[], None] = lambda: None,
        reconnects: Callable[[], int],
        on_lost: Callable[[Exception | None], None] = lambda _exc: None,
        meta_only: bool = False,
        include_history: bool = False,
        retry_s: float = 1.0,
        check_s: float = 2.0,
    ) -> None:
        self._bucket = bucket
        self._on_entry = on_entry
        self._on_synced = on_synced
        self._on_lost = on_lost
        self._meta_only = meta_only
        self._include_history = include_history
        self._retry_s = retry_s
        self._reconnects = reconnects
        self._check_s = check_s
        self._name = name
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name=self._name)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _watch(self) -> None:
        while True:
            try:
                started_at = self._reconnects()
                kv = await self._bucket()
                watcher = await kv.watchall(
                    meta_only=self._meta_only, include_history=self._include_history
                )
                try:
                    while True:
                        try:
                            with cancellation_kept():  # (nats-py's updates is a wait_for)
                                entry = await watcher.updates(timeout=self._check_s)  # type: ignore[no-untyped-call]
                        except nats.errors.TimeoutError:
                            if self._reconnects() == started_at:
                                continue
                            log.info("%s: NATS reconnected; the watch starts again", self._name)
                            break
                        if entry is None:  # the bucket's present values are all in
                            self._on_synced()
                        else:
                            self._on_entry(entry)
                finally:
                    self._on_lost(None)
                    with contextlib.suppress(Exception):  # (bounded: a closing bus may not answer)
                        async with asyncio.timeout(self._check_s):
                            await watcher.stop()  # type: ignore[no-untyped-call]
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS down, no JetStream, no bucket yet: again later
                log.info("%s: the watch stopped (%s); trying again", self._name, exc)
                self._on_lost(exc)
                await asyncio.sleep(self._retry_s)
