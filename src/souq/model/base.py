"""Base classes for Souq's typed data: frozen, and strict about unknown keys where input enters.

A user's typo must not pass silently, but a peer one minor version ahead (a newer broker or
agent during a rolling upgrade) may send fields this process does not know yet. So :class:`Input`
rejects unknown keys, except while validating a message from a peer: the protocol decodes every
message with ``extra=FROM_PEER`` (:mod:`souq.bus.codec`, :mod:`souq.protocol`), which drops
unknown keys at every level of the message instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

__all__ = ["FROM_PEER", "Input", "Record", "as_peer", "copy_fields", "from_peer"]

# How a message from another process treats keys this one does not know: they are dropped.
FROM_PEER: Final[Literal["ignore"]] = "ignore"
_PEER: ContextVar[bool] = ContextVar("souq_from_peer", default=False)
_T = TypeVar("_T")


@contextlib.contextmanager
def as_peer() -> Iterator[None]:
    """Validate a peer's message: fields this process refuses from a user but a newer peer may
    honour (Fly's, :mod:`souq.model.fly_fields`) are dropped like unknown keys."""
    token = _PEER.set(True)
    try:
        yield
    finally:
        _PEER.reset(token)


def from_peer() -> bool:
    """Whether the validation under way is of a peer's message (:func:`as_peer`)."""
    return _PEER.get()


def copy_fields(target: type[_T], source: object, **given: Any) -> _T:
    """One record copied into another: a ``target`` (a model or a dataclass) made of ``source``'s
    attributes named as its fields, with ``given`` over them; the fields ``source`` has no
    attribute for take their defaults."""
    names = (
        list(target.model_fields)
        if issubclass(target, BaseModel)
        else [f.name for f in dataclasses.fields(target)]  # type: ignore[arg-type]
    )
    shared = {name: getattr(source, name) for name in names if hasattr(source, name)}
    return target(**(shared | given))


class Record(BaseModel):
    """Data Souq produces (machines, offers, explanations): frozen, unknown keys ignored so that an
    older peer can read a newer one's messages."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class Input(BaseModel):
    """Data a user or a peer sends: frozen, strict types, unknown keys rejected (a typo must not
    pass silently), except in a message from a peer (validated with ``extra=FROM_PEER``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
