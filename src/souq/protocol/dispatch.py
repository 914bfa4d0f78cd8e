"""The worker side of the protocol: bytes in, a handler per verb, a reply envelope out.

A :class:`Dispatcher` is a table ``verb name -> (verb, handler)``. :meth:`Dispatcher.answer`
decodes the request with the verb's type (unknown keys of a newer peer dropped), runs the
handler and encodes its result; every error becomes an error envelope, so the caller gets the
typed error it was (a verb this side does not know is :class:`~souq.errors.UnknownVerb`).
The dispatcher knows nothing of subjects or transports: the agent's bus shell and the hollow
fleet both call it with the verb's name and the payload.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from souq.bus.codec import error_reply, ok_reply
from souq.errors import InvalidInput, SouqError, UnknownVerb
from souq.protocol.verbs import PROTOCOL_MAJOR, PROTOCOL_MINOR, Verb

__all__ = ["Dispatcher", "VerbHandler"]

log = logging.getLogger(__name__)

Q = TypeVar("Q", bound=BaseModel)
VerbHandler = Callable[[Any], Awaitable[Any]]


class Dispatcher:
    """Routes each verb to its handler. ``owner`` names this side in errors (``worker w-1``)."""

    def __init__(self, owner: str, *, ledger: Callable[[], int] | None = None) -> None:
        """``ledger()``: the worker's ledger version, named in every successful reply."""
        self.owner = owner
        self._ledger = ledger
        self._routes: dict[str, tuple[Verb[Any, Any], VerbHandler]] = {}

    def route(self, verb: Verb[Q, Any], handler: Callable[[Q], Awaitable[Any]]) -> None:
        self._routes[verb.name] = (verb, handler)

    @property
    def verbs(self) -> list[str]:
        return sorted(self._routes)

    def knows(self, name: str) -> bool:
        return name in self._routes

    async def answer(self, name: str, data: bytes) -> bytes:
        """The reply envelope to ``data`` sent as verb ``name``."""
        route = self._routes.get(name)
        if route is None:
            return error_reply(self._unknown(name))
        verb, handler = route
        try:
            request = verb.decode_request(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            return error_reply(
                InvalidInput(
                    f"malformed {verb.name} request: {where}: {first['msg']}",
                    details={"field": where},
                )
            )
        try:
            result = await handler(request)
            return ok_reply(result, ledger=self._ledger() if self._ledger else None)
        except SouqError as exc:
            return error_reply(exc)
        except Exception as exc:
            log.exception("%s failed to answer %s", self.owner, verb.name)
            return error_reply(SouqError(f"{self.owner} failed to answer {verb.name}: {exc!r}"))

    def _unknown(self, name: str) -> UnknownVerb:
        return UnknownVerb(
            f"{self.owner} does not know the verb {name!r} (it speaks protocol "
            f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}: {', '.join(self.verbs)})",
            hint="the peer is older than the caller; upgrade it, or avoid the newer verb",
            details={"verb": name, "protocol": f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}"},
        )
