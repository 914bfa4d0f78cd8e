"""Every request gets a request id (the caller's ``X-Request-Id``, or a new one), echoed in the
response, and bound — with the app and machine of the path — to every log line of the request
(see :mod:`souq.logs`). Plain ASGI, so that streaming responses pass through untouched."""

from __future__ import annotations

import re
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from souq.http_layer import HttpLayer
from souq.ids import new_request_id
from souq.logs import log_context

__all__ = ["RequestContext"]

_PATH = re.compile(r"^/v1/apps/([^/]+)(?:/machines/([^/]+))?")
_HEADER = b"x-request-id"


class RequestContext(HttpLayer):
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = dict(scope.get("headers") or []).get(_HEADER)
        request_id = given.decode("latin-1")[:128] if given else new_request_id()
        match = _PATH.match(str(scope.get("path", "")))
        app = match.group(1) if match else None
        machine = match.group(2) if match else None
        if machine in {"batch"}:
            machine = None

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers: list[Any] = list(message.get("headers") or [])
                headers.append((_HEADER, request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        with log_context(request_id=request_id, app=app, machine_id=machine):
            await self.app(scope, receive, send_with_id)
