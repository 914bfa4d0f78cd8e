"""How ``souq quota ...`` prints a quota: a part of :mod:`souq.client.render` (the only
printer)."""

from __future__ import annotations

from typing import Any

from souq.client.render import _grid, _json_or, _out
from souq.model.quota import DIMENSIONS, QuotaView

__all__ = ["quota"]


@_json_or
def quota(q: QuotaView) -> None:
    rows: list[tuple[str, Any]] = [("quota of", f"{q.scope} {q.name}")]
    for dimension in DIMENSIONS:
        limit = getattr(q.limits, dimension)
        use = getattr(q.use, dimension)
        rows.append((dimension, f"{use:g} of {'no limit' if limit is None else f'{limit:g}'}"))
    if q.pending_creates:
        rows.append(("pending", f"{q.pending_creates} create(s) under way, counted above"))
    _out().print(_grid(rows, bold_names=True))
