"""Request bodies over their route's limit are refused with 413 ``payload_too_large`` before
they are read whole.

Plain ASGI, outside every other layer of an API (authentication included) so that nothing
reads a body first. A declared ``Content-Length`` over the limit is answered at once, unread;
a chunked body is counted as it is received and refused as soon as it passes the limit (the
route that reads it sees :class:`~souq.errors.PayloadTooLarge` raised by ``receive``). The
answer closes the connection when the rest of the body was not read, so that nobody waits
for it. The limits themselves are in :mod:`souq.limits`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from souq.errors import PayloadTooLarge
from souq.http_layer import HttpLayer, answer_before_start
from souq.limits import BODY_DEFAULT_BYTES, size_text

__all__ = ["BodyLimit", "RouteLimit"]


@dataclass(frozen=True, slots=True)
class RouteLimit:
    """Bodies of ``method`` requests to paths matching ``path`` (a regular expression,
    matched whole) may be up to ``limit`` bytes; ``route`` names it in the error."""

    method: str
    path: str
    limit: int
    route: str


class BodyLimit(HttpLayer):
    def __init__(
        self,
        app: ASGIApp,
        *,
        default: int = BODY_DEFAULT_BYTES,
        routes: Sequence[RouteLimit] = (),
    ) -> None:
        super().__init__(app)
        self.default = default
        self._routes = [(r.method, re.compile(r.path), r) for r in routes]

    def limit_for(self, method: str, path: str) -> tuple[int, str]:
        """The body limit of a request, and the route it is named by in the error."""
        for want, pattern, route in self._routes:
            if want == method and pattern.fullmatch(path):
                return route.limit, route.route
        return self.default, "this API's routes"

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit, route = self.limit_for(scope["method"], scope["path"])
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(_too_large(limit, route), scope, receive, send)
            return
        received = 0
        complete = declared == 0

        async def counted(  # the body as the app reads it, refused past the limit
        ) -> Message:
            nonlocal received, complete
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > limit:
                    raise _too_large(limit, route)
            return message

        async def closing(message: Message) -> None:  # a refused body: close, unread
            start = message["type"] == "http.response.start"
            if start and message["status"] == 413 and not complete:
                message = {**message, "headers": [*message.get("headers", ()), _CLOSE]}
            await send(message)

        async def refuse(exc: PayloadTooLarge) -> None:
            await _refuse(exc, scope, receive, send)

        await answer_before_start(
            lambda noting: self.app(scope, counted, noting), closing, PayloadTooLarge, refuse
        )


_CLOSE = (b"connection", b"close")


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _too_large(limit: int, route: str) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body is larger than {size_text(limit)}, the limit of {route}",
        hint="send less; the limits are listed in docs/limits.md",
        details={"limit_bytes": limit},
    )


async def _refuse(err: PayloadTooLarge, scope: Scope, receive: Receive, send: Send) -> None:
    headers = {"connection": "close"}
    response = JSONResponse(err.to_body(), status_code=err.http_status, headers=headers)
    await response(scope, receive, send)
