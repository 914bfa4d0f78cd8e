"""The private network each app's machines are on (:func:`souq.network.addresses.network_of`:
the app's own ``network``, else its organization's), as the broker sends it with every claim.

Read from the app's record (:mod:`souq.broker.app_store`) at the app's first create on this
broker and remembered: an app's network never changes while it exists. An app that was never
created is on the default organization's network. A broker whose bus is not NATS (in-memory
tests) has no app records: every app is on the default network there.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from souq.broker.app_store import AppStore
from souq.model.app import DEFAULT_ORG, AppRecord
from souq.network.addresses import network_of

__all__ = ["AppNetworks"]

log = logging.getLogger(__name__)

_MAX_REMEMBERED = 100_000


class AppNetworks:
    def __init__(
        self, store: Callable[[], Awaitable[AppStore]], *, has_store: Callable[[], bool]
    ) -> None:
        self._store = store
        self._has_store = has_store  # false: the bus is not NATS (no app records anywhere)
        self._known: dict[str, str] = {}

    async def of(self, app: str) -> str:
        known = self._known.get(app)
        if known is not None:
            return known
        if not self._has_store():  # an in-memory bus: no app records, one network
            return network_of(DEFAULT_ORG)
        # Unavailable (JetStream down) fails the create: never a machine on the wrong network.
        record = await (await self._store()).get(app)
        return self.remember(app, record)

    def remember(self, app: str, record: AppRecord | None) -> str:
        """The app's network from its record (none: never created), remembered."""
        network = network_of(record.org_slug, record.network) if record else network_of("")
        if len(self._known) >= _MAX_REMEMBERED:
            self._known.clear()
        self._known[app] = network
        return network

    def forget(self, app: str) -> None:
        """The app was created or deleted here: read its record again at its next create."""
        self._known.pop(app, None)
