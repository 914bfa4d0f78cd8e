"""JSON on the wire: typed models in, bytes out, and the reply envelope carrying typed errors.

A reply is ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {...}}``. Each is
written in one pass and read in one: the envelope is a msgspec struct whose ``result`` is
:class:`msgspec.Raw`, so :func:`ok_reply` embeds a result already encoded (:class:`Encoded`,
or a model's own JSON) without parsing or re-encoding it, and :func:`unwrap_as` reads the
envelope without parsing the result, which is then decoded once, as the expected type.

A type is a pydantic model (validated with ``extra=FROM_PEER``: keys a newer peer added are
dropped, not refused, see :mod:`souq.model.base`) or a msgspec struct (decoded by msgspec, which
drops unknown keys too; the machine events a view reads are such structs, :mod:`souq.model.wire`).
A malformed envelope or result is :class:`InvalidInput`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

import msgspec
import pydantic_core
from pydantic import BaseModel, TypeAdapter, ValidationError

from souq.bus.transport import Handler
from souq.errors import InvalidInput, SouqError, error_from_body
from souq.model.base import FROM_PEER, as_peer

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
    "with_members",
    "without_members",
]

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

# A value msgspec does not know (a pydantic model inside a plain result, a path ...) is encoded
# as pydantic would.
_ENCODER = msgspec.json.Encoder(enc_hook=pydantic_core.to_jsonable_python)


def encode(model: BaseModel | msgspec.Struct) -> bytes:
    if isinstance(model, msgspec.Struct):
        return _ENCODER.encode(model)
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


def encode_many(encoded: Sequence[bytes | str]) -> bytes:
    """Already encoded models as one JSON array (a batch in one message, a list's answer),
    each embedded as it is."""
    return _ENCODER.encode([msgspec.Raw(item) for item in encoded])


_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])


def without_members(obj: bytes | str, names: set[str]) -> bytes:
    """A JSON object's text without the members ``names``, read one level deep only: the
    others copied as they are, in their order."""
    parts = _MEMBERS.decode(obj)
    return _ENCODER.encode({k: v for k, v in parts.items() if k not in names})


def with_members(obj: bytes | str, members: dict[str, Any], *, first: bool = False) -> bytes:
    """A JSON object's text with ``members`` added (or replaced; at its end, or its start with
    ``first``), read one level deep only: its other members' values are copied as they are."""
    parts = _MEMBERS.decode(obj)
    if first:
        return _ENCODER.encode({**members, **{k: v for k, v in parts.items() if k not in members}})
    return _ENCODER.encode({**parts, **members})


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


class _Ok(msgspec.Struct, omit_defaults=True):
    """A successful reply as written: ``ledger`` only when there is one."""

    ok: bool
    result: msgspec.Raw
    ledger: int | None = None


class _Failed(msgspec.Struct):
    """A failed reply as written (``result`` is ``null``, as older peers wrote it)."""

    ok: bool
    result: None
    error: dict[str, Any]


class _Envelope(msgspec.Struct):
    """A reply as read: its result left as it came, to be decoded as the caller expects."""

    ok: bool
    result: msgspec.Raw = msgspec.Raw()  # empty when the reply has none
    error: dict[str, Any] | None = None
    ledger: int | None = None

    def empty(self) -> bool:
        return not self.result or (len(self.result) == 4 and bytes(self.result) == b"null")


_ENVELOPE = msgspec.json.Decoder(_Envelope)


def ok_reply(
    result: BaseModel | msgspec.Struct | Encoded | list[Any] | dict[str, Any] | None,
    *,
    ledger: int | None = None,
) -> bytes:
    """``{"ok": true, "result": ...}``; ``ledger``: the worker's ledger version once the request
    was done (what a broker's book needs to count its own claim exactly once)."""
    if isinstance(result, Encoded):
        payload = msgspec.Raw(result.json)
    elif isinstance(result, list):
        payload = msgspec.Raw(_ENCODER.encode([_raw(item) for item in result]))
    else:
        payload = _raw(result)
    return _ENCODER.encode(_Ok(True, payload, ledger))


def _raw(value: Any) -> msgspec.Raw:
    """One value's JSON, as a part of a larger message."""
    if isinstance(value, BaseModel):
        return msgspec.Raw(value.model_dump_json().encode())
    if isinstance(value, msgspec.Struct):
        return msgspec.Raw(_ENCODER.encode(value))
    return msgspec.Raw(pydantic_core.to_json(value))


def error_reply(err: SouqError) -> bytes:
    return _ENCODER.encode(_Failed(False, None, err.to_body()))


def _envelope(data: bytes) -> _Envelope:
    try:
        return _ENVELOPE.decode(data)
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"malformed reply: {exc}") from exc


def _raised(reply: _Envelope) -> SouqError:
    return error_from_body(reply.error or {"error": "empty reply"})


def unwrap(data: bytes) -> Any:
    """The result of a reply envelope as plain JSON values, or its error raised as the typed
    error it was."""
    reply = _envelope(data)
    if not reply.ok:
        raise error_from_body(reply.error or {})
    return None if reply.empty() else msgspec.json.decode(reply.result)


@cache
def _reader(kind: Any) -> Callable[[bytes], Any]:
    """How a result of type ``kind`` (a model, a struct, ``list[model]`` ...) is decoded."""
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return msgspec.json.Decoder(kind).decode
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        model = kind

        def validated(raw: bytes) -> Any:
            return model.model_validate_json(bytes(raw), extra=FROM_PEER)

        return validated
    adapter: TypeAdapter[Any] = TypeAdapter(kind)

    def adapted(raw: bytes) -> Any:
        return adapter.validate_json(bytes(raw), extra=FROM_PEER)

    return adapted


def unwrap_typed(data: bytes, kind: Any) -> Any:
    """The result of a reply envelope decoded as ``kind`` (a model, ``list[model]`` ...), or
    the reply's error raised as the typed error it was."""
    return unwrap_with_ledger(data, kind)[0]


def unwrap_with_ledger(data: bytes, kind: Any) -> tuple[Any, int | None]:
    """:func:`unwrap_typed`, and the ledger version the reply names (None when it names
    none)."""
    reply = _envelope(data)
    if not reply.ok or reply.empty():
        raise _raised(reply)
    try:
        with as_peer():
            return _reader(kind)(reply.result), reply.ledger
    except ValidationError as exc:
        raise InvalidInput(f"malformed reply: {exc.errors()[0]['msg']}") from exc
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"malformed reply: {exc}") from exc


def unwrap_as(data: bytes, model: type[M]) -> M:
    """The result of a reply envelope validated as ``model``, or the reply's error raised."""
    result: M = unwrap_typed(data, model)
    return result


def unwrap_list_as(data: bytes, model: type[M]) -> list[M]:
    """The result of a reply envelope validated as a list of ``model``."""
    result: list[M] = unwrap_typed(data, list[model])  # type: ignore[valid-type]
    return result
