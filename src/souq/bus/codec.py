"""JSON on the wire: typed models in, bytes out, and the reply envelope carrying typed errors."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from souq.errors import InvalidInput, SouqError, error_from_body
from souq.model.protocol import Reply

__all__ = ["decode", "encode", "error_reply", "ok_reply", "unwrap"]

M = TypeVar("M", bound=BaseModel)


def encode(model: BaseModel) -> bytes:
    return model.model_dump_json(exclude_none=False).encode()


def decode(data: bytes, model: type[M]) -> M:
    """Parse bytes into ``model``; a malformed message becomes :class:`InvalidInput`."""
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise InvalidInput(f"malformed {model.__name__} message: {exc.errors()[0]['msg']}") from exc


def ok_reply(result: BaseModel | list[Any] | dict[str, Any] | None) -> bytes:
    if isinstance(result, BaseModel):
        payload: Any = result.model_dump(mode="json")
    elif isinstance(result, list):
        payload = [r.model_dump(mode="json") if isinstance(r, BaseModel) else r for r in result]
    else:
        payload = result
    return Reply(ok=True, result=payload).model_dump_json().encode()


def error_reply(err: SouqError) -> bytes:
    return Reply(ok=False, error=err.to_body()).model_dump_json().encode()


def unwrap(data: bytes) -> Any:
    """The result of a reply envelope, or its error raised as the typed error it was."""
    reply = Reply.model_validate_json(data)
    if not reply.ok:
        raise error_from_body(reply.error or {})
    return reply.result
