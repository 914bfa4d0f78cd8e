"""Tokens and the audit log over HTTP.

* ``POST /v1/tokens`` (admin): a new token, minted with the cluster's private key — for one
  app or all, a scope, an optional expiry and a name. The answer is the only place the token
  appears.
* ``GET /v1/tokens/self``: what the caller's own token grants.
* ``GET /v1/tokens/key``: the cluster's public token key, with which a holder narrows a token
  offline (``souq token narrow``) and anyone checks one.
* ``DELETE /v1/tokens/{id}`` (admin): revoke a token and its narrowed copies, on every broker
  (:mod:`souq.broker.revocations`); ``GET /v1/tokens/revoked`` lists them.
* ``GET /v1/audit`` (admin): the newest mutating calls, oldest first (``?app=``, ``?limit=``).

Present only when the broker runs with an auth directory (:class:`Guard`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from souq.auth.files import AuthDir
from souq.auth.tokens import Grant, Scope, Verifier, mint, public_key_text
from souq.broker.audit import AuditLog
from souq.broker.bodies import body_schema, json_response, parse_body
from souq.broker.revocations import Revocations
from souq.broker.schemas import check_app_name
from souq.errors import InvalidInput, Unauthorized
from souq.model.tokens import AuditRecord, NewToken, TokenInfo, TokenKey

__all__ = ["Guard", "tokens_router"]


@dataclass(frozen=True)
class Guard:
    """What a broker with an auth directory checks tokens with, and records calls in."""

    auth: AuthDir
    verifier: Verifier
    audit: AuditLog
    revocations: Revocations

    @classmethod
    def of(cls, auth: AuthDir, client: Any) -> Guard:
        verifier = auth.verifier()
        return cls(auth, verifier, AuditLog(client), Revocations(client, verifier))

    async def close(self) -> None:
        await self.revocations.close()
        await self.audit.close()


def _info(grant: Grant, token: str | None = None) -> TokenInfo:
    return TokenInfo(
        id=grant.token_id,
        name=grant.name,
        app=grant.app,
        scope=grant.scope.value,
        expires_at=grant.expires_at.isoformat() if grant.expires_at else None,
        narrowed=grant.narrowed,
        token=token,
    )


def _grant(request: Request) -> Grant:
    grant = request.scope.get("state", {}).get("grant")
    if not isinstance(grant, Grant):
        raise Unauthorized("this route needs a token")
    return grant


def tokens_router(guard: Guard) -> APIRouter:
    router = APIRouter(tags=["tokens"])
    key: Any = guard.auth.signing_key()
    audit = guard.audit

    @router.post(
        "/v1/tokens", status_code=201, response_model=TokenInfo, openapi_extra=body_schema(NewToken)
    )
    async def create_token(request: Request) -> Response:
        """A new token (admin only); the answer carries it, nothing else ever will."""
        body = await parse_body(request, NewToken)
        if body.app != "*" and (problem := check_app_name(body.app)):
            raise InvalidInput(problem, details={"field": "app"})
        made_by = _grant(request)
        name = body.name or f"made by {made_by.identity}"
        token, grant = mint(key, app=body.app, scope=Scope(body.scope), ttl_s=body.ttl_s, name=name)
        return json_response(_info(grant, token), status_code=201)

    @router.get("/v1/tokens/self", response_model=TokenInfo)
    async def token_self(request: Request) -> Response:
        """What the token of this request grants."""
        return json_response(_info(_grant(request)))

    @router.get("/v1/tokens/key", response_model=TokenKey)
    async def token_key() -> Response:
        return json_response(TokenKey(public_key=public_key_text(key)))

    @router.delete("/v1/tokens/{token_id}", status_code=204)
    async def revoke_token(token_id: str, request: Request) -> Response:
        """Revoke the token with that id (``t_…``) and every narrowed copy of it, for good."""
        if not (token_id.startswith("t_") and len(token_id) <= 64 and token_id[2:].isalnum()):
            raise InvalidInput(f"{token_id!r} is not a token id (t_…; see souq token show)")
        await guard.revocations.revoke(token_id, by=_grant(request).identity)
        return Response(status_code=204)

    @router.get("/v1/tokens/revoked", response_model=dict[str, dict[str, Any]])
    async def revoked_tokens() -> Response:
        """Every revoked token id, with when and by which token."""
        return JSONResponse(await guard.revocations.revoked())

    @router.get("/v1/audit", response_model=list[AuditRecord])
    async def audit_log(
        app: Annotated[str | None, Query(max_length=63)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> Response:
        """The newest mutating calls (of one app), oldest first, with the token that made each."""
        return json_response(await audit.entries(app=app, limit=limit))

    return router
