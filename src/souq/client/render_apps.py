"""How ``souq apps ...`` prints apps: a part of :mod:`souq.client.render` (the only printer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text

from souq.client.render import _grid, _json_or, _listing, _out, line
from souq.model.app import App, AppDeleted

__all__ = ["app", "app_deleted", "apps"]

_STYLES = {"deployed": "green", "suspended": "yellow", "pending": "cyan"}


def _status(a: App) -> Text:
    return Text(str(a.status), style=_STYLES.get(str(a.status), ""))


def _states(a: App) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(a.states.items())) or "-"


def _row(a: App) -> tuple[Any, ...]:
    created = a.created_at or "(implicit)"
    return (a.name, _status(a), a.organization.slug, str(a.machine_count), created, _states(a))


@_json_or
def apps(items: Sequence[App]) -> None:
    titles = ("NAME", "STATUS", "ORG", "MACHINES", "CREATED", "STATES")
    _listing(items, "apps", titles, _row)


@_json_or
def app(a: App) -> None:
    rows: list[tuple[str, Any]] = [
        ("name", a.name),
        ("id", a.id),
        ("status", _status(a)),
        ("organization", a.organization.slug),
        ("machines", str(a.machine_count)),
        ("states", _states(a)),
        ("regions", ", ".join(a.regions) or "-"),
        ("created", a.created_at or "never: it exists because it has machines"),
    ]
    if a.network:
        rows.append(("network", a.network))
    if a.app_role:
        rows.append(("role", a.app_role))
    _out().print(_grid(rows, bold_names=True))


@_json_or
def app_deleted(d: AppDeleted) -> None:
    count = len(d.destroyed_machines)
    line(f"destroyed app {d.name} and its {count} machine{'' if count == 1 else 's'}")
