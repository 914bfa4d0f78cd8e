"""Identifiers: machines and workers have short random hex ids; request ids may be derived."""

from __future__ import annotations

import hashlib
import secrets

__all__ = ["idempotent_request_id", "new_machine_id", "new_request_id", "new_worker_id"]


def new_machine_id() -> str:
    """14 hex characters, as Fly machine ids."""
    return secrets.token_hex(7)


def new_worker_id() -> str:
    return "w" + secrets.token_hex(6)


def new_request_id() -> str:
    return secrets.token_hex(8)


def idempotent_request_id(app: str, key: str) -> str:
    """A request id derived from an ``Idempotency-Key``: the same key for the same app gives the
    same id on every broker, which is what lets a worker recognise a retried claim."""
    return "k" + hashlib.sha256(f"{app}\x00{key}".encode()).hexdigest()[:15]
