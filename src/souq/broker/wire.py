"""Requests to workers over the bus: encode a command, send it, unwrap the typed reply."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter

from souq.bus import Transport, encode, subjects, unwrap

__all__ = ["ask_worker", "load", "load_list"]

M = TypeVar("M", bound=BaseModel)


def load(model: type[M], result: Any) -> M:
    """A model from a reply's result. Results arrive as decoded JSON, so they are validated as
    JSON: strict models then accept enum values and the like exactly as on the wire."""
    return model.model_validate_json(json.dumps(result))


def load_list(model: type[M], result: Any) -> list[M]:
    return TypeAdapter(list[model]).validate_json(json.dumps(result))  # type: ignore[valid-type]


async def ask_worker(
    transport: Transport, worker_id: str, verb: str, body: BaseModel, *, timeout: float
) -> Any:
    """Send one command to one worker; its result, or its error raised as the typed error."""
    reply = await transport.request(subjects.worker(worker_id, verb), encode(body), timeout)
    return unwrap(reply)
