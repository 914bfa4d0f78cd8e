"""Tokens as the API shows them: a request for a new one, what one grants, the audit log."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from souq.model.choices import ScopeName

__all__ = ["AuditRecord", "NewToken", "TokenInfo", "TokenKey"]


class NewToken(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    app: str = Field(
        default="*",
        max_length=63,
        description="the app the token is for; `*`: every app and the cluster",
    )
    scope: ScopeName = Field(
        default="read",
        description="read ⊂ write ⊂ deploy ⊂ admin; queue ⊂ deploy: a batch worker of the app",
    )
    ttl_s: float | None = Field(
        default=None, gt=0, le=10 * 365 * 86400, description="seconds it lasts; none: no expiry"
    )
    name: str = Field(default="", max_length=128, description="who or what holds it")


class TokenInfo(BaseModel):
    """What a token grants (never the token itself, except in the answer that made it)."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    app: str
    scope: ScopeName
    expires_at: str | None = None
    narrowed: int = Field(default=0, description="blocks its holders appended to narrow it")
    token: str | None = Field(default=None, description="only in the answer that made it")


class TokenKey(BaseModel):
    model_config = ConfigDict(frozen=True)

    public_key: str = Field(description="the cluster's public token key (ed25519/<hex>)")


class AuditRecord(BaseModel):
    """One mutating call, as the audit log keeps it."""

    model_config = ConfigDict(frozen=True)

    at_ms: int
    token: str = Field(description="the token's id (`t_…`, `+N` when narrowed N times)")
    token_name: str
    method: str
    path: str
    app: str | None
    status: int
    request_id: str | None
    client: str | None
