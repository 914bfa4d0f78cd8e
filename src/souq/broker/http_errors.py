"""Errors at the HTTP boundary: every failure becomes ``{error, status, hint?}`` with the HTTP
status of its place in the error tree (:mod:`souq.errors`). Validation errors name the field."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from souq.errors import InvalidInput, MalformedRequest, NotFound, SouqError
from souq.http_layer import HttpLayer, answer_before_start

__all__ = [
    "AnswerUnexpected",
    "install_error_handlers",
    "invalid_input",
    "souq_error_response",
    "unexpected_error_response",
]

log = logging.getLogger(__name__)

_LOCATION_KINDS = {"body", "query", "path", "header", "cookie"}
_MAX_LISTED = 5


def _field_path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def _message(error: dict[str, Any]) -> str:
    if error.get("type") == "extra_forbidden":
        return "unknown field"
    msg = str(error.get("msg", "is not valid"))
    return msg.removeprefix("Value error, ")


def invalid_input(errors: Sequence[Any]) -> InvalidInput:
    """An :class:`InvalidInput` (or :class:`MalformedRequest` when the body is not JSON) from
    pydantic's or FastAPI's error list, naming each field by its dotted path."""
    errors = [dict(e) for e in errors]
    for e in errors:
        if e.get("type") == "json_invalid":
            reason = (e.get("ctx") or {}).get("error") or e.get("msg", "")
            return MalformedRequest(
                f"the request body is not valid JSON: {reason}",
                hint="send a JSON object with Content-Type: application/json",
            )
    fields = []
    for e in errors:
        loc = list(e.get("loc", ()))
        if loc and loc[0] in _LOCATION_KINDS and (len(loc) > 1 or loc[0] != "body"):
            loc = loc[1:]
        fields.append({"field": _field_path(loc), "message": _message(e)})
    listed = "; ".join(f"{f['field']}: {f['message']}" for f in fields[:_MAX_LISTED])
    if len(fields) > _MAX_LISTED:
        listed += f"; and {len(fields) - _MAX_LISTED} more"
    return InvalidInput(listed or "invalid input", details={"fields": fields})


def souq_error_response(err: SouqError) -> JSONResponse:
    return JSONResponse(err.to_body(), status_code=err.http_status)


def unexpected_error_response(method: str, path: str, exc: Exception) -> JSONResponse:
    """A 500 ``internal`` for an exception no handler expected: a bug, logged with its trace."""
    log.error("unexpected error on %s %s", method, path, exc_info=exc)
    err = SouqError(f"internal error: {exc}", hint="this is a bug in Souq; please report it")
    return souq_error_response(err)


class AnswerUnexpected(HttpLayer):
    """An exception no handler expected becomes a 500 ``internal`` here, and goes no further.
    Starlette's last handler answers it and then raises it again, and the server, seeing an
    exception after a response, closes the connection: a keep-alive client's next request on
    it was reset. Only an exception after the response began is raised on (the connection
    cannot carry on after half a response)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def answer(exc: Exception) -> None:
            response = unexpected_error_response(scope["method"], scope["path"], exc)
            await response(scope, receive, send)

        await answer_before_start(
            lambda noting: self.app(scope, receive, noting), send, Exception, answer
        )


def install_error_handlers(app: FastAPI) -> None:
    async def on_souq_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SouqError)
        return souq_error_response(exc)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return souq_error_response(invalid_input(exc.errors()))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        route = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            return souq_error_response(NotFound(f"no such route: {route}"))
        if exc.status_code == 405:
            body = {"error": f"method not allowed: {route}", "status": "method_not_allowed"}
        else:
            body = {"error": str(exc.detail), "status": f"http_{exc.status_code}"}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        return unexpected_error_response(request.method, request.url.path, exc)

    app.add_exception_handler(SouqError, on_souq_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)  # what a middleware outside raises
    app.add_middleware(AnswerUnexpected)
