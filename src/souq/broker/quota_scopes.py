"""Which scopes have a quota: the keys of the ``souq-quotas`` bucket, kept in memory by a watch,
so that a create in a scope with no quota (most of them) reads and writes nothing of JetStream,
and goes on while JetStream does not answer, as creates did before quotas existed.

Until the watch has delivered the bucket's keys once (or while it is down since), nothing is
known and every create asks JetStream, as without it. A quota set on one broker reaches the
others as fast as JetStream tells them; a create placed in that moment is not counted as it
is made, and the scope's next reconciliation (before a refusal, and on ``GET``) counts it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from nats.js.kv import KeyValue

from souq.bus.jetstream import BucketWatch

__all__ = ["QuotaScopes"]

_GONE = ("DEL", "PURGE")


class QuotaScopes:
    def __init__(
        self, bucket: Callable[[], Awaitable[KeyValue]], reconnects: Callable[[], int]
    ) -> None:
        self.keys: set[str] = set()
        self.known = False  # the keys were delivered once and the watch runs
        self._watch = BucketWatch(
            bucket,
            lambda entry: self.applied(entry.key, entry.operation),
            name="souq-quotas",
            reconnects=reconnects,
            on_synced=self._synced,
            on_lost=self._lost,
            meta_only=True,
        )

    def start(self) -> None:
        self._watch.start()

    async def close(self) -> None:
        await self._watch.close()

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

    def _synced(self) -> None:
        self.known = True

    def _lost(self, exc: Exception | None) -> None:
        self.known = False
        if exc is not None:
            self.keys.clear()  # the next watch delivers them all again
