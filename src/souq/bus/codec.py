"""JSON on the wire: typed models in, bytes out, and the reply envelope carrying typed errors.

A reply is ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {...}}``. Replies are
written and read in one pass each: :func:`ok_reply` splices the result's JSON into the envelope,
and :func:`unwrap_as` validates envelope and result together into the expected model.

Everything read here comes from another process, so it is validated with ``extra=FROM_PEER``:
keys a newer peer added are dropped, not refused (see :mod:`souq.model.base`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Generic, TypeVar

import pydantic_core
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from souq.bus.transport import Handler
from souq.errors import InvalidInput, SouqError, error_from_body
from souq.model.base import FROM_PEER, as_peer
from souq.model.protocol import Reply

__all__ = [
    "Encoded",
    "decode",
    "decode_one_or_many",
    "decoding",
    "encode",
    "encode_many",
    "error_reply",
    "ok_reply",
    "unwrap",
    "unwrap_as",
    "unwrap_list_as",
    "unwrap_typed",
    "unwrap_with_ledger",
]

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def encode(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


def decode(data: bytes, model: type[M]) -> M:
    """Parse bytes into ``model``; a malformed message becomes :class:`InvalidInput`."""
    try:
        with as_peer():
            return model.model_validate_json(data, extra=FROM_PEER)
    except ValidationError as exc:
        raise InvalidInput(f"malformed {model.__name__} message: {exc.errors()[0]['msg']}") from exc


def decoding(
    decode: Callable[[bytes], T],
    handle: Callable[[T], object],
    *,
    ignoring: str,
    log: logging.Logger,
) -> Handler:
    """A subscription's handler: each message ``decode``-d and handed to ``handle``; a malformed
    one is dropped with a warning, ``"<ignoring> on <subject>: <why>"``."""

    async def handler(subject: str, data: bytes) -> None:
        try:
            message = decode(data)
        except SouqError as exc:
            log.warning("%s on %s: %s", ignoring, subject, exc)
            return
        handle(message)

    return handler


def encode_many(encoded: Sequence[bytes]) -> bytes:
    """Already encoded models as one JSON array (a batch in one message)."""
    return b"[" + b",".join(encoded) + b"]"


@cache
def _list_of(model: type[BaseModel]) -> TypeAdapter[list[Any]]:
    return TypeAdapter(list[model])  # type: ignore[valid-type]


def decode_one_or_many(data: bytes, model: type[M]) -> list[M]:
    """A message that is one ``model`` or a JSON array of them (see :func:`encode_many`)."""
    if data.lstrip()[:1] != b"[":
        return [decode(data, model)]
    try:
        with as_peer():
            items: list[M] = _list_of(model).validate_json(data, extra=FROM_PEER)
    except ValidationError as exc:
        raise InvalidInput(f"malformed {model.__name__} batch: {exc.errors()[0]['msg']}") from exc
    return items


@dataclass(frozen=True)
class Encoded:
    """A result already encoded as JSON: :func:`ok_reply` puts it in the envelope as it is."""

    json: bytes


def ok_reply(
    result: BaseModel | Encoded | list[Any] | dict[str, Any] | None, *, ledger: int | None = None
) -> bytes:
    """``{"ok": true, "result": ...}``; ``ledger``: the worker's ledger version once the request
    was done (what a broker's book needs to count its own claim exactly once)."""
    if isinstance(result, Encoded):
        payload = result.json
    elif isinstance(result, BaseModel):
        payload = result.model_dump_json().encode()
    elif isinstance(result, list):
        payload = b"[" + b",".join(_json(item) for item in result) + b"]"
    else:
        payload = pydantic_core.to_json(result)
    tail = b"}" if ledger is None else b',"ledger":' + str(ledger).encode() + b"}"
    return b'{"ok":true,"result":' + payload + tail


def _json(item: Any) -> bytes:
    return (
        item.model_dump_json().encode()
        if isinstance(item, BaseModel)
        else pydantic_core.to_json(item)
    )


def error_reply(err: SouqError) -> bytes:
    return Reply(ok=False, error=err.to_body()).model_dump_json().encode()


def unwrap(data: bytes) -> Any:
    """The result of a reply envelope as plain JSON values, or its error raised as the typed
    error it was."""
    reply = Reply.model_validate_json(data)
    if not reply.ok:
        raise error_from_body(reply.error or {})
    return reply.result


class _Envelope(BaseModel, Generic[T]):
    model_config = ConfigDict(extra="ignore")

    ok: bool
    result: T | None = None
    error: dict[str, Any] | None = None
    ledger: int | None = None


@cache
def _envelope(kind: Any) -> type[_Envelope[Any]]:
    return _Envelope[kind]


def unwrap_typed(data: bytes, kind: Any) -> Any:
    """The result of a reply envelope validated as ``kind`` (a model, ``list[model]`` ...), or
    the reply's error raised as the typed error it was."""
    return unwrap_with_ledger(data, kind)[0]


def unwrap_with_ledger(data: bytes, kind: Any) -> tuple[Any, int | None]:
    """:func:`unwrap_typed`, and the ledger version the reply names (None when it names
    none)."""
    try:
        with as_peer():
            reply = _envelope(kind).model_validate_json(data, extra=FROM_PEER)
    except ValidationError as exc:
        # A malformed result may still be a well-formed error: let the error speak first.
        plain = Reply.model_validate_json(data)
        if not plain.ok:
            raise error_from_body(plain.error or {}) from exc
        raise InvalidInput(f"malformed reply: {exc.errors()[0]['msg']}") from exc
    if not reply.ok or reply.result is None:
        raise error_from_body(reply.error or {"error": "empty reply"})
    return reply.result, reply.ledger


def unwrap_as(data: bytes, model: type[M]) -> M:
    """The result of a reply envelope validated as ``model``, or the reply's error raised."""
    result: M = unwrap_typed(data, model)
    return result


def unwrap_list_as(data: bytes, model: type[M]) -> list[M]:
    """The result of a reply envelope validated as a list of ``model``."""
    result: list[M] = unwrap_typed(data, list[model])  # type: ignore[valid-type]
    return result
