"""A worker's machines in one short string, for anti-entropy: the worker and a cluster view each
compute it over the machines they hold, and only a worker whose digest differs is fetched again.

Pure: the same function runs in the agent (over its records) and in the view (over its rows).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["machines_digest"]


def machines_digest(rows: Iterable[tuple[str, str, str]]) -> str:
    """SHA-256 over the sorted ``(id, state, updated_at)`` of the machines not destroyed."""
    h = hashlib.sha256()
    for machine_id, state, updated_at in sorted(rows):
        h.update(f"{machine_id}\x1f{state}\x1f{updated_at}\x1e".encode())
    return h.hexdigest()[:32]
