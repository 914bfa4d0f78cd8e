"""Base classes for Souq's typed data: frozen, and strict about unknown keys where input enters.

A user's typo must not pass silently, but a peer one minor version ahead (a newer broker or
agent during a rolling upgrade) may send fields this process does not know yet. So :class:`Input`
rejects unknown keys, except while validating a message from a peer: :data:`PEER` is the
validation context the protocol decodes with (:mod:`souq.protocol`), and under it unknown keys
are dropped at every level of the message.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

__all__ = ["PEER", "Input", "Record"]

PEER: dict[str, Any] = {"peer": True}  # validation context of a message from another process


class Record(BaseModel):
    """Data Souq produces (machines, offers, explanations): frozen, unknown keys ignored so that an
    older peer can read a newer one's messages."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class Input(BaseModel):
    """Data a user or a peer sends: frozen, strict types, unknown keys rejected (a typo must not
    pass silently), except in a message from a peer (:data:`PEER`), where they are dropped."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_keys_of_newer_peers(cls, data: Any, info: ValidationInfo) -> Any:
        if info.context is None or not info.context.get("peer") or not isinstance(data, dict):
            return data
        known = _keys(cls)
        if known.issuperset(data):
            return data
        return {k: v for k, v in data.items() if k in known}


_KEYS: dict[type[BaseModel], frozenset[str]] = {}


def _keys(model: type[BaseModel]) -> frozenset[str]:
    """The keys ``model`` accepts: its field names and their aliases."""
    keys = _KEYS.get(model)
    if keys is None:
        names = set(model.model_fields)
        names.update(f.alias for f in model.model_fields.values() if f.alias)
        keys = _KEYS[model] = frozenset(names)
    return keys
