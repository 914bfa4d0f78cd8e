"""Identifiers: machines and workers have short random hex ids; request ids may be derived."""

from __future__ import annotations

import hashlib
import secrets

__all__ = [
    "QUOTE_PREFIX",
    "idempotent_request_id",
    "new_id_on",
    "new_instance_id",
    "new_machine_id",
    "new_quote_id",
    "new_request_id",
    "new_worker_id",
    "quote_worker",
    "worker_in_id",
]


QUOTE_PREFIX = "q"  # a quote id is q_<worker>_<hex> (new_id_on)


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


def new_id_on(prefix: str, worker_id: str) -> str:
    """``<prefix>_<worker>_<hex>``: an id that names the worker holding what it names (a quote,
    a volume), so that any broker routes its verbs there without asking around."""
    return f"{prefix}_{worker_id}_{secrets.token_hex(6)}"


def worker_in_id(identifier: str, prefix: str) -> str | None:
    """The worker named in an id :func:`new_id_on` made with ``prefix``, or None when it is
    not such an id."""
    head, _, tail = identifier.rpartition("_")
    given, _, worker = head.partition("_")
    if given != prefix or not worker or not tail.isalnum():
        return None
    return worker


def new_quote_id(worker_id: str) -> str:
    """A quote id names the worker that holds it, so any broker can route its use."""
    return new_id_on(QUOTE_PREFIX, worker_id)


def quote_worker(quote_id: str) -> str | None:
    """The worker named in a quote id, or None when the id is not one Souq made."""
    return worker_in_id(quote_id, QUOTE_PREFIX)
