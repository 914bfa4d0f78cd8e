"""What Souq's plain ASGI layers share (:mod:`souq.http_limits`,
:mod:`souq.broker.request_context`, :mod:`souq.broker.http_errors`): a layer that acts on HTTP
requests only and passes every other scope through, and the answer to an exception raised
before the response began."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HttpLayer", "answer_before_start"]

E = TypeVar("E", bound=Exception)


class HttpLayer(ABC):
    """A plain ASGI layer over ``app``: an HTTP request goes to :meth:`handle`, every other
    scope (lifespan, websocket) straight to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    @abstractmethod
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One HTTP request, on its way to ``app``."""


async def answer_before_start(
    run: Callable[[Send], Awaitable[None]],
    send: Send,
    catch: type[E],
    answer: Callable[[E], Awaitable[None]],
) -> None:
    """``run`` the app with ``send``, noting whether the response began: a ``catch`` raised
    before it began is ``answer``-ed, one raised after is raised on (the connection cannot carry
    on after half a response)."""
    started = False

    async def send_noting_start(message: Message) -> None:
        nonlocal started
        started = started or message["type"] == "http.response.start"
        await send(message)

    try:
        await run(send_noting_start)
    except catch as exc:
        if started:
            raise
        await answer(exc)
