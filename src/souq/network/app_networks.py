"""Which private network each app is on: its organisation and its own ``network``, from the
apps' records (JetStream's ``souq-apps`` bucket, the broker's :mod:`souq.broker.app_store`),
kept in memory by a watch: a query never asks for it.

An app with no record (made by a machine's create alone) is on its organisation's default
network, ``personal`` (Fly's default, as Souq has one organisation). A change of an app's
record is told (``on_change``) so that the names re-scope its machines.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.aio.client import Client
from nats.js.kv import KeyValue
from pydantic import ValidationError

from souq.bus.jetstream import BucketWatch, open_key_value, reconnects
from souq.model.app import DEFAULT_ORG, AppRecord
from souq.network.names import Scope

__all__ = ["AppNetworks", "scope_of_record"]

log = logging.getLogger(__name__)

BUCKET = "souq-apps"  # souq.broker.app_store's (named here: no I/O layer imports the broker's)
DEFAULT_SCOPE = Scope(DEFAULT_ORG)


def scope_of_record(record: AppRecord) -> Scope:
    return Scope(record.org_slug or DEFAULT_ORG, record.network)


class AppNetworks:
    """``scope_of(app)`` from the records as the watch last saw them. ``start()`` once the
    connection is up, ``await close()``."""

    def __init__(self, client: Client, *, on_change: Callable[[str], None]) -> None:
        self._client = client
        self._on_change = on_change
        self._scopes: dict[str, Scope] = {}
        self.seen = asyncio.Event()  # the first pass over the bucket is done
        self._watch = BucketWatch(
            self._bucket,
            lambda entry: self.apply(entry.key, entry.value),
            name="souq-app-nets",
            reconnects=lambda: reconnects(client),
            on_synced=self.seen.set,
        )

    async def _bucket(self) -> KeyValue:
        return await open_key_value(
            self._client, BUCKET, "souq apps", what="the app store", make=False
        )

    def scope_of(self, app: str) -> Scope:
        return self._scopes.get(app, DEFAULT_SCOPE)

    def start(self) -> None:
        self._watch.start()

    async def close(self) -> None:
        await self._watch.close()

    def apply(self, app: str, value: bytes | None) -> None:
        """One key's value as the watch gives it (None or empty: the app was deleted)."""
        scope = DEFAULT_SCOPE
        if value:
            try:
                scope = scope_of_record(AppRecord.model_validate_json(value))
            except ValidationError as exc:
                log.warning("the names cannot read app %s's record: %s", app, exc)
                return
        if self._scopes.get(app, DEFAULT_SCOPE) != scope:
            if scope == DEFAULT_SCOPE:
                self._scopes.pop(app, None)
            else:
                self._scopes[app] = scope
            self._on_change(app)
