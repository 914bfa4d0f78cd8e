"""The private network each app's machines are on (:func:`souq.network.addresses.network_of`:
the app's own ``network``, else its organization's), as the broker sends it with every claim.

Read from the app's record (:mod:`souq.broker.app_store`) at the app's first create on this
broker and remembered: an app's network never changes while it exists. An app that was never
created is on the default organization's network. While the app's record cannot be read (JetStream
unavailable) the network is :data:`~souq.network.addresses.UNKNOWN_NETWORK`: only a worker
without a private network takes such a claim. A broker whose bus is not NATS (in-memory
tests) has no app records: every app is on the default network there.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from souq.broker.app_store import AppStore
from souq.errors import Unavailable
from souq.model.app import DEFAULT_ORG, AppRecord
from souq.network.addresses import UNKNOWN_NETWORK, network_of

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
        # JetStream unavailable: the network is not known, and nothing is remembered. A worker
        # without a private network takes the machine all the same; one with it refuses the
        # claim (never a machine on the wrong network), and the create goes on elsewhere.
        try:
            record = await (await self._store()).get(app)
        except Unavailable as exc:
            log.info("the network of %s is not known now: %s", app, exc)
            return UNKNOWN_NETWORK
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
