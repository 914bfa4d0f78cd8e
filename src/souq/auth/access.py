"""Every request's token, checked before anything else reads the request; every mutating call
recorded with who made it.

:class:`Access` is plain ASGI (streams pass through untouched) and sits outside everything but
the request id: a request without a valid token (401 ``unauthorized``) or outside its token's
scope (403 ``forbidden``) reaches no route, and no body is read for it. What each route needs is
:func:`souq.auth.routes.need_of`'s to say. A route whose app is in what it reads (a batch job's
record) is let through with any valid token and asks the request's :class:`Permit` itself, as
does a route whose answer depends on more than its scope (a machine's create: whether the token
may read the app's secrets).

The token itself is never logged, recorded or echoed: the audit entry carries the token's id
(``t_…``, with ``+N`` when its holder narrowed it N times) and its name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from souq.auth.routes import need_of
from souq.auth.tokens import ALL_APPS, Grant, Verifier
from souq.auth.tokens import Scope as Action
from souq.errors import SouqError, Unauthorized
from souq.model.tokens import AuditRecord

__all__ = ["Access", "Permit", "permit_of"]

log = logging.getLogger("souq.audit")

_READS = {"GET", "HEAD", "OPTIONS"}


class Access:
    def __init__(
        self,
        app: ASGIApp,
        verifier: Verifier,
        audit: Callable[[AuditRecord], None] | None = None,
    ) -> None:
        self.app = app
        self._verifier = verifier
        self._audit = audit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        need = need_of(method, path)
        if need is None:
            await self.app(scope, receive, send)
            return
        header = _header(scope, b"authorization")
        try:
            app = need.app
            if need.by_route:
                grant = self._verifier.authenticate(header)
            else:
                if need.any_app:
                    app = _token_app(self._verifier.grant(header))
                grant = self._verifier.authorize(header, app=app, action=need.action)
        except SouqError as exc:
            if method not in _READS:
                self._record(scope, None, need.app, exc.http_status)
            await _refusal(exc)(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["grant"] = grant
        state["permit"] = Permit(self._verifier, header, grant)
        if method in _READS or self._audit is None:
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            self._record(scope, grant, need.app, status)

    def _record(self, scope: Scope, grant: Grant | None, app: str | None, status: int) -> None:
        client = scope.get("client")
        # A route whose app is in its body (``POST /v1/apps``) names it once it has read it.
        app = (scope.get("state") or {}).get("audit_app") or app
        entry = AuditRecord(
            at_ms=int(time.time() * 1000),
            token=grant.identity if grant else "-",
            token_name=grant.name if grant else "",
            method=scope["method"],
            path=scope["path"],
            app=app,
            status=status,
            request_id=_header(scope, b"x-request-id"),
            client=f"{client[0]}:{client[1]}" if client else None,
        )
        log.info(
            "%s %s %s by %s (%s)",
            entry.method,
            entry.path,
            entry.status,
            entry.token,
            entry.token_name or "unnamed",
        )
        if self._audit is not None:
            self._audit(entry)


@dataclass(frozen=True)
class Permit:
    """What the request's token may do, for a route that asks about an app it learns from what
    it reads. Without a verifier (a broker run without auth) everything is allowed."""

    verifier: Verifier | None = None
    header: str | None = None
    grant: Grant | None = None

    @property
    def app(self) -> str | None:
        """The one app the token is for (its first block's), or None for every app."""
        return None if self.grant is None else _token_app(self.grant)

    def allows(self, app: str, action: Action) -> bool:
        if self.verifier is None:
            return True
        return self.verifier.allows(self.header, app=app, action=action)

    def require(self, app: str, action: Action) -> None:
        """:class:`~souq.errors.Forbidden` unless the token may do ``action`` on ``app``."""
        if self.verifier is not None:
            self.verifier.authorize(self.header, app=app, action=action)


def permit_of(state: dict[str, object] | None) -> Permit:
    """The request's permit (from its ASGI scope's ``state``; everything, without auth)."""
    found = (state or {}).get("permit")
    return found if isinstance(found, Permit) else Permit()


def _token_app(grant: Grant) -> str | None:
    return None if grant.app == ALL_APPS else grant.app


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _refusal(exc: SouqError) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Bearer realm="souq"'} if isinstance(exc, Unauthorized) else {}
    return JSONResponse(exc.to_body(), status_code=exc.http_status, headers=headers)
