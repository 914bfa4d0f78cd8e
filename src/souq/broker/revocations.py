"""Revoked tokens: a key per token id in JetStream's key-value bucket ``souq-revoked``, watched
by every broker.

Checking a token stays free of lookups: each broker keeps the revoked ids in memory
(:meth:`souq.auth.tokens.Verifier.revoke`), filled from the bucket when it starts and kept
current by a watch, so a revocation reaches every broker as fast as JetStream tells them (a test
waits for both brokers of a cluster to refuse the token). A token's narrowed copies carry its id,
so they go with it. A revocation is never taken back: make a new token instead.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue

from souq.auth.tokens import Verifier
from souq.bus.jetstream import (
    BucketWatch,
    OnFirstUse,
    live_keys,
    open_key_value,
    reconnects,
    unavailable,
)

__all__ = ["BUCKET", "Revocations"]

BUCKET = "souq-revoked"
_WHAT = "the revocation list"


class Revocations:
    def __init__(
        self, client: Callable[[], Client], verifier: Verifier, *, make: bool = True
    ) -> None:
        """``make``: the bucket is made on first use (a broker's); without, the one a broker
        made is watched (the proxy's: it may read the bucket, not make it)."""
        self._verifier = verifier
        self._bucket = OnFirstUse(lambda: _open(client(), make=make))
        self._watch = BucketWatch(
            self._bucket.get,
            self._applied,
            name="souq-revoked",
            reconnects=lambda: reconnects(client()),
        )

    def start(self) -> None:
        self._watch.start()

    async def close(self) -> None:
        await self._watch.close()

    def _applied(self, entry: KeyValue.Entry) -> None:
        if entry.value:
            self._verifier.revoke(entry.key)

    async def revoke(self, token_id: str, by: str) -> None:
        """Record the revocation (every broker's watch applies it; this one at once)."""
        record = {"revoked_at_ms": int(time.time() * 1000), "by": by}
        try:
            await (await self._bucket.get()).put(token_id, json.dumps(record).encode())
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        self._verifier.revoke(token_id)

    async def revoked(self) -> dict[str, dict[str, object]]:
        """Every revoked token id, with when and by whom."""
        kv = await self._bucket.get()
        out: dict[str, dict[str, object]] = {}
        try:
            for key in await live_keys(kv):
                entry = await kv.get(key)
                out[key] = json.loads(entry.value or b"{}")
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        return out


async def _open(nc: Client, *, make: bool = True) -> KeyValue:
    description = "souq revoked tokens: one key per token id"
    return await open_key_value(nc, BUCKET, description, what=_WHAT, make=make)
