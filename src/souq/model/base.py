"""Base classes for Souq's typed data: frozen, and strict about unknown keys where input enters."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Input", "Record"]


class Record(BaseModel):
    """Data Souq produces (machines, offers, explanations): frozen, unknown keys ignored so that an
    older peer can read a newer one's messages."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class Input(BaseModel):
    """Data a user or a peer sends: frozen, strict types, unknown keys rejected (a typo must not
    pass silently)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
