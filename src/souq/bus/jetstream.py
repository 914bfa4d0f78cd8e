"""What Souq keeps in JetStream shares: a key-value bucket made (or bound to) on first use, the
error it raises when JetStream is not there, and a store opened once however many ask at once.
The image store (:mod:`souq.images.store`) and the release store
(:mod:`souq.broker.releases`) are built on them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from nats.js.api import KeyValueConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from souq.errors import Unavailable

__all__ = ["OnFirstUse", "key_value", "unavailable"]

T = TypeVar("T")


def unavailable(what: str, exc: BaseException) -> Unavailable:
    """``what`` (a store) did not answer: NATS is down, or runs without JetStream."""
    return Unavailable(
        f"{what} is not available: {exc or type(exc).__name__}",
        hint="NATS must run with JetStream enabled (nats-server --jetstream)",
    )


async def key_value(
    js: JetStreamContext, bucket: str, description: str, *, replicas: int = 1
) -> KeyValue:
    """The bucket (made on first use: file storage, one value per key, ``replicas`` copies)."""
    return await js.create_key_value(
        config=KeyValueConfig(
            bucket=bucket,
            description=description,
            storage=StorageType.FILE,
            replicas=replicas,
            history=1,
        )
    )


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
