"""Identifiers: machines and workers have short random hex ids; request ids may be derived."""

from __future__ import annotations

import hashlib
import secrets

__all__ = [
    "idempotent_request_id",
    "new_instance_id",
    "new_machine_id",
    "new_quote_id",
    "new_request_id",
    "new_worker_id",
    "quote_worker",
]


def new_machine_id() -> str:
    """14 hex characters, as Fly machine ids."""
    return secrets.token_hex(7)


def new_instance_id(now_ms: int) -> str:
    """A machine config's version: ordered by time (12 hex digits of milliseconds), then 8
    random ones."""
    return f"{now_ms:012x}{secrets.token_hex(4)}"


def new_worker_id() -> str:
    return "w" + secrets.token_hex(6)


def new_request_id() -> str:
    return secrets.token_hex(8)


def idempotent_request_id(app: str, key: str) -> str:
    """A request id derived from an ``Idempotency-Key``: the same key for the same app gives the
    same id on every broker, which is what lets a worker recognise a retried claim."""
    return "k" + hashlib.sha256(f"{app}\x00{key}".encode()).hexdigest()[:15]


def new_quote_id(worker_id: str) -> str:
    """A quote id names the worker that holds it, so any broker can route its use."""
    return f"q_{worker_id}_{secrets.token_hex(6)}"


def quote_worker(quote_id: str) -> str | None:
    """The worker named in a quote id, or None when the id is not one Souq made."""
    parts = quote_id.split("_")
    if len(parts) != 3 or parts[0] != "q" or not parts[1] or not parts[2].isalnum():
        return None
    return parts[1]
