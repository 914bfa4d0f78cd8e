"""How ``souq volume ...`` prints volumes: a part of :mod:`souq.client.render` (the only
printer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text

from souq.client.render import _grid, _json_or, _listing, _out
from souq.model.volume import Volume

__all__ = ["volume", "volumes"]

_STYLES = {"created": "green", "destroying": "yellow", "destroyed": "dim"}


def _state(v: Volume) -> Text:
    return Text(str(v.state), style=_STYLES.get(str(v.state), ""))


def _row(v: Volume) -> tuple[Any, ...]:
    attached = v.attached_machine_id or "-"
    return (v.id, v.name, _state(v), f"{v.size_gb} GB", v.region, v.worker_id, attached)


@_json_or
def volumes(items: Sequence[Volume]) -> None:
    titles = ("ID", "NAME", "STATE", "SIZE", "REGION", "WORKER", "ATTACHED TO")
    _listing(items, "volumes", titles, _row)


@_json_or
def volume(v: Volume) -> None:
    rows: list[tuple[str, Any]] = [
        ("id", v.id),
        ("name", v.name),
        ("state", _state(v)),
        ("size", f"{v.size_gb} GB"),
        ("region", v.region),
        ("worker", v.worker_id),
        ("attached to", v.attached_machine_id or "-"),
        ("created", v.created_at),
    ]
    if v.used_mb is not None:
        rows.append(("used", f"{v.used_mb} MiB"))
    _out().print(_grid(rows, bold_names=True))
