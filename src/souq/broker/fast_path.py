"""The create route as plain ASGI: ``POST /v1/apps/{app}/machines`` answered before FastAPI's
routing and middleware.

A create is the API's hot path: at a thousand creates a second the framework around it
(routing, its exception and error middleware, dependency solving, the response object) was
about a sixth of the broker's CPU per create (docs/benchmarks.md, "Creates"). Here the request
is matched by one regular expression, its body read from the ASGI channel and handed to the
same function the FastAPI route calls (:data:`CreateHandler`), so that both answer alike; the
route stays declared in FastAPI for its OpenAPI entry and for paths this does not take.

Errors are answered as :mod:`souq.broker.http_errors` answers them: a :class:`SouqError` with
its body and status, anything else as a logged 500 ``internal``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from starlette.datastructures import Headers, QueryParams
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from souq.auth.access import Permit, permit_of
from souq.broker.http_errors import souq_error_response, unexpected_error_response
from souq.errors import SouqError

__all__ = ["CreateFastPath", "CreateHandler"]

# (app, body, headers, query, what the token may) -> (status, JSON text); raises SouqError.
CreateHandler = Callable[[str, bytes, Headers, QueryParams, Permit], Awaitable[tuple[int, str]]]

_CREATE = re.compile(r"/v1/apps/([^/]+)/machines")


class CreateFastPath:
    def __init__(self, app: ASGIApp, create: CreateHandler) -> None:
        self.app = app
        self._create = create

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _CREATE.fullmatch(scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        body = await _body(receive)
        if body is None:
            return  # the client went away
        response: Response
        try:
            status, content = await self._create(
                match.group(1),
                body,
                Headers(scope=scope),
                QueryParams(scope["query_string"]),
                permit_of(scope.get("state")),
            )
            response = Response(content, status_code=status, media_type="application/json")
        except SouqError as exc:
            response = souq_error_response(exc)
        except Exception as exc:
            response = unexpected_error_response("POST", scope["path"], exc)
        await response(scope, receive, send)


async def _body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
