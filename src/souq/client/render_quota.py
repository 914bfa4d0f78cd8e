"""How ``souq quota ...`` prints a quota: a part of :mod:`souq.client.render` (the only
printer)."""

from __future__ import annotations

from typing import Any

from souq.client.render import _grid, _json_or, _out
from souq.model.choices import PriorityClass
from souq.model.quota import CLASS_DIMENSIONS, CLASSES, DIMENSIONS, QuotaView

__all__ = ["quota"]


def _of(use: float, limit: float | None) -> str:
    return f"{use:g} of {'no limit' if limit is None else f'{limit:g}'}"


@_json_or
def quota(q: QuotaView) -> None:
    rows: list[tuple[str, Any]] = [("quota of", f"{q.scope} {q.name}")]
    for dimension in DIMENSIONS:
        rows.append((dimension, _of(getattr(q.use, dimension), getattr(q.limits, dimension))))
    for klass in CLASSES:
        line = q.limits.classes.get(PriorityClass(klass))
        use = q.use_by_class.get(klass)
        if line is None and (use is None or use.machines == 0):
            continue
        for dimension in CLASS_DIMENSIONS:
            limit = None if line is None else getattr(line, dimension)
            rows.append((f"{klass} {dimension}", _of(getattr(use, dimension, 0), limit)))
    if q.pending_creates:
        rows.append(("pending", f"{q.pending_creates} change(s) under way, counted above"))
    _out().print(_grid(rows, bold_names=True))
