"""Which scopes have a quota: the keys of the ``souq-quotas`` bucket, kept in memory by a watch,
so that a create in a scope with no quota (most of them) reads and writes nothing of JetStream,
and goes on while JetStream does not answer, as creates did before quotas existed.

Until the watch has delivered the bucket's keys once (or while it is down since), nothing is
known and every create asks JetStream, as without it. A quota set on one broker reaches the
others as fast as JetStream tells them; a create placed in that moment is not counted as it
is made, and the scope's next reconciliation (before a refusal, and on ``GET``) counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import nats.errors
from nats.js.kv import KeyValue

__all__ = ["QuotaScopes"]

log = logging.getLogger(__name__)

_RETRY_S = 1.0  # the watch starts again this long after it failed (NATS down, no JetStream)
_GONE = ("DEL", "PURGE")


class QuotaScopes:
    def __init__(self, bucket: Callable[[], Awaitable[KeyValue]]) -> None:
        self._bucket = bucket
        self.keys: set[str] = set()
        self.known = False  # the keys were delivered once and the watch runs
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="souq-quotas")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def without_quota(self, app_key: str) -> bool:
        """Whether it is known that neither ``app_key`` nor any organization has a quota."""
        return (
            self.known
            and app_key not in self.keys
            and not any(k.startswith("org.") for k in self.keys)
        )

    def applied(self, key: str, operation: str | None) -> None:
        if operation in _GONE:
            self.keys.discard(key)
        else:
            self.keys.add(key)

    async def _watch(self) -> None:
        while True:
            try:
                kv = await self._bucket()
                watcher = await kv.watchall(meta_only=True)
                try:
                    while True:
                        try:
                            entry = await watcher.updates(timeout=3600)  # type: ignore[no-untyped-call]
                        except nats.errors.TimeoutError:
                            continue
                        if entry is None:  # the keys there were are all delivered
                            self.known = True
                            continue
                        self.applied(entry.key, entry.operation)
                finally:
                    self.known = False
                    with contextlib.suppress(Exception):
                        await watcher.stop()  # type: ignore[no-untyped-call]
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS down or no JetStream: ask JetStream meanwhile
                log.info("quota scopes: the watch stopped (%s); trying again", exc)
                self.keys.clear()
                await asyncio.sleep(_RETRY_S)
