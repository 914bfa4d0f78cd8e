"""The caller's side of the protocol: one :class:`WorkerClient` for every request to workers.

The broker, its batch path, the cluster view, the tests and the benchmarks all talk to workers
through it, with typed verbs (:mod:`souq.protocol.verbs`) instead of subject strings:

* :meth:`WorkerClient.call` — one verb to one worker; the typed reply, or the worker's error
  raised as the typed error it was (:class:`~souq.errors.Unavailable` when nobody answers);
* :meth:`WorkerClient.call_each` — one verb to each of some workers, the replies gathered into
  one inbox (e.g. a sample of workers asked for offers);
* :meth:`WorkerClient.ask_region` — the region's offer subject, everyone in it answering;
* :meth:`WorkerClient.ask_all` — ``souq.all.<verb>``, every worker answering for itself.

Gathers never raise for a missing or unreadable reply: the caller counts what came back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from souq.bus import Transport, encode, subjects
from souq.bus.codec import unwrap_typed, unwrap_with_ledger
from souq.errors import SouqError
from souq.model.protocol import Offer, OfferRequest
from souq.protocol.verbs import OFFER, Verb

__all__ = ["WorkerClient"]

log = logging.getLogger(__name__)

Q = TypeVar("Q", bound=BaseModel)
A = TypeVar("A")


class WorkerClient:
    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    @property
    def connected(self) -> bool:
        return self.transport.connected

    async def call(self, worker_id: str, verb: Verb[Q, A], request: Q, *, timeout: float) -> A:
        data = await self.transport.request(
            subjects.worker(worker_id, verb.name), encode(request), timeout
        )
        reply: A = unwrap_typed(data, verb.reply)
        return reply

    async def call_with_ledger(
        self, worker_id: str, verb: Verb[Q, A], request: Q, *, timeout: float
    ) -> tuple[A, int | None]:
        """:meth:`call`, and the worker's ledger version once it was done (claims: the book
        counts the claim until the worker's word of that version or a newer one)."""
        data = await self.transport.request(
            subjects.worker(worker_id, verb.name), encode(request), timeout
        )
        reply: tuple[A, int | None] = unwrap_with_ledger(data, verb.reply)
        return reply

    async def call_each(
        self, workers: Sequence[str], verb: Verb[Q, A], request: Q, *, timeout: float
    ) -> list[A]:
        replies = await self.transport.gather_from(
            [subjects.worker(w, verb.name) for w in workers], encode(request), timeout=timeout
        )
        return _readable(replies, verb)

    async def ask_region(
        self, region: str, request: OfferRequest, *, expect: int | None, timeout: float
    ) -> list[Offer]:
        """Every worker of ``region`` answers ``request`` with an offer (the ``offer`` verb on
        the region's subject), until ``expect`` have answered or ``timeout`` passes."""
        replies = await self.transport.gather(
            subjects.offers(region), encode(request), expect=expect, timeout=timeout
        )
        return _readable(replies, OFFER)

    async def ask_all(
        self, verb: Verb[Q, A], request: Q, *, expect: int | None, timeout: float
    ) -> list[A]:
        replies = await self.transport.gather(
            subjects.all_workers(verb.name), encode(request), expect=expect, timeout=timeout
        )
        return _readable(replies, verb)


def _readable(replies: Sequence[bytes], verb: Verb[Any, A]) -> list[A]:
    out: list[A] = []
    for data in replies:
        try:
            out.append(unwrap_typed(data, verb.reply))
        except (SouqError, ValueError) as exc:
            log.warning("ignoring a %s reply that could not be read: %s", verb.name, exc)
    return out
