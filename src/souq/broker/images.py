"""The broker's view of the cluster's images: the store, opened on first use, and the records
that machines' ``config.image`` names, resolved before any capacity is claimed.

A record named by its reference (``sha256:…``) never changes, so it is kept once read (up to
:data:`KEEP`); a name is looked up every time, since a later image may take it over. A create
whose image is unknown fails with ``image_not_found`` before its placement starts.

A name is looked up in the cluster's store first, in Docker's normal form
(:func:`souq.images.names.image_name`: ``nginx``, ``docker.io/library/nginx:latest`` and
``registry-1.docker.io/library/nginx:latest`` are one name), so an image an operator imported
under its registry's name runs without that registry in reach. Only a name written with its
registry (``HOST[:PORT]/REPO[:TAG|@sha256:…]``) that the store does not hold is described from
that registry (its manifest and config: :func:`souq.images.registry.describe`); its record names
the registry as its ``source``, and each worker pulls the layers from there itself. A short name
(``busybox``) is the store's only: it never dials out.

Every lookup is one app's (the machine's): its own names first, then the cluster's, never
another app's; a digest only if the app may run it (:meth:`ImageStore.may_run`). That an app
may run an image is kept once known (it is never taken back).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

from nats.aio.client import Client

from souq.bus.jetstream import OnFirstUse
from souq.errors import ImageNotFound, Unavailable
from souq.images import registry
from souq.images.store import ImageStore, not_stored_hint
from souq.model.image import ImageRecord
from souq.model.machine import MachineConfig

__all__ = ["KEEP", "ImageResolver"]

KEEP = 1024  # records kept by reference


class ImageResolver:
    def __init__(self, client: Callable[[], Client]) -> None:
        self._store = OnFirstUse(lambda: ImageStore.open(client()))
        self._records: OrderedDict[str, ImageRecord] = OrderedDict()
        self._runs: OrderedDict[tuple[str, str], None] = OrderedDict()  # (app, reference)

    async def store(self) -> ImageStore:
        """The cluster's image store (:class:`~souq.errors.Unavailable` without JetStream)."""
        return await self._store.get()

    async def resolve(self, ref: str, app: str) -> ImageRecord:
        """The image ``ref`` names (a reference or a name) for a machine of ``app``;
        ``image_not_found`` else (an image ``app`` may not run too)."""
        kept = self._records.get(ref)
        if kept is not None and (app, ref) in self._runs:
            self._records.move_to_end(ref)
            self._runs.move_to_end((app, ref))
            return kept
        try:
            record = await (await self.store()).record(ref, app=app)
        except (ImageNotFound, Unavailable):
            if not registry.is_registry_reference(ref):
                raise
            # Not in the store (or no store: a NATS without JetStream): its registry's.
            record = await self._from_registry(ref)
        self._records[record.reference] = record
        self._runs[(app, record.reference)] = None
        if len(self._records) > KEEP:
            self._records.popitem(last=False)
        if len(self._runs) > KEEP:
            self._runs.popitem(last=False)
        return record

    @staticmethod
    async def _from_registry(ref: str) -> ImageRecord:
        """The record of ``ref`` described from its registry; a registry out of reach says
        how to run the image without it."""
        try:
            return await asyncio.to_thread(registry.describe_record, ref, name=ref)
        except Unavailable as exc:
            raise Unavailable(
                f"{exc.message}, and the cluster's store has no image named {ref!r}",
                hint=not_stored_hint(registry.split_reference(ref)[1]),
            ) from exc

    async def of_config(self, config: MachineConfig, app: str) -> ImageRecord | None:
        """The image a machine config of ``app`` runs, if it names one."""
        return None if config.image is None else await self.resolve(config.image, app)
