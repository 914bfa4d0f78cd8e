"""Base classes for Souq's typed data: frozen, and strict about unknown keys where input enters.

A user's typo must not pass silently, but a peer one minor version ahead (a newer broker or
agent during a rolling upgrade) may send fields this process does not know yet. So :class:`Input`
rejects unknown keys, except while validating a message from a peer: the protocol decodes every
message with ``extra=FROM_PEER`` (:mod:`souq.bus.codec`, :mod:`souq.protocol`), which drops
unknown keys at every level of the message instead.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["FROM_PEER", "Input", "Record"]

# How a message from another process treats keys this one does not know: they are dropped.
FROM_PEER: Final[Literal["ignore"]] = "ignore"


class Record(BaseModel):
    """Data Souq produces (machines, offers, explanations): frozen, unknown keys ignored so that an
    older peer can read a newer one's messages."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class Input(BaseModel):
    """Data a user or a peer sends: frozen, strict types, unknown keys rejected (a typo must not
    pass silently), except in a message from a peer (validated with ``extra=FROM_PEER``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
