"""How ``souq deploy``, ``releases``, ``status`` and ``scale`` print: a deploy's progress and plan,
an app's releases and its machines' status. A part of :mod:`souq.client.render` (the only
printer)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from souq.client.render import _cell_state, _err, _json_or, _listing, _out
from souq.model.choices import MachineState

if TYPE_CHECKING:  # records load as a command reads them
    from souq.model import Machine
    from souq.model.release import Release

__all__ = ["app_status", "deploy_event", "deploy_plan", "deploy_progress", "releases"]


def deploy_event(event: dict[str, Any], *, as_json: bool = False) -> None:
    """One step of a deploy: a JSON object a line with ``--json``, else a line for people."""
    if as_json:
        sys.stdout.write(json.dumps(event, ensure_ascii=False) + "\n")
        sys.stdout.flush()
        return
    if event["kind"] == "failed":
        return  # the command's error says it next, with its hint: once
    where = " ".join(str(event[k]) for k in ("region", "machine_id") if event.get(k))
    mark = {"failed": "✗", "done": "✓", "healthy": "✓", "rollback": "↩"}.get(event["kind"], "•")
    text = f"{mark} {event['message']}" + (f"  [{where}]" if where else "")
    console = _err() if event["kind"] == "failed" else _out()
    console.print(text, style="bold" if event["kind"] in ("phase", "done", "failed") else None)


@contextmanager
def deploy_progress(
    *, as_json: bool, console: Console | None = None
) -> Iterator[Callable[[dict[str, Any]], None]]:
    """What shows a deploy's events: on a terminal, a live table of its machines (region, phase,
    what happened last) under the phase under way; else a line each (JSON with ``--json``)."""
    out = console or _out()
    if as_json or not out.is_terminal:
        yield lambda event: deploy_event(event, as_json=as_json)
        return
    machines: dict[str, tuple[str, str, str]] = {}
    headline: list[str] = []

    def view() -> Group:
        table = Table(box=None, pad_edge=False)
        for title in ("MACHINE", "REGION", "PHASE", "LAST"):
            table.add_column(title, no_wrap=True)
        for machine_id, (region, phase, last) in machines.items():
            table.add_row(machine_id, region, phase, last)
        return Group(Text("\n".join(headline[-3:]), style="bold"), table)

    with Live(view(), console=out, refresh_per_second=8, transient=False) as live:

        def show(event: dict[str, Any]) -> None:
            if event["kind"] == "failed":
                return  # the command's error says it next, with its hint: once
            machine_id = event.get("machine_id")
            if machine_id:
                region, phase, _ = machines.get(machine_id, ("", "", ""))
                machines[machine_id] = (
                    event.get("region") or region,
                    event.get("phase") or phase,
                    event["message"],
                )
            else:
                headline.append(event["message"])
            live.update(view())

        yield show


@_json_or
def releases(items: Sequence[Release]) -> None:
    titles = ("VERSION", "STATE", "STRATEGY", "CREATED", "IMAGE", "REASON")
    _listing(items, "releases", titles, _release_row)


def _release_row(r: Release) -> tuple[Any, ...]:
    return (f"v{r.version}", _cell_state(str(r.state)), r.strategy, r.created_at, r.image, r.reason)


@_json_or
def app_status(items: Sequence[Machine]) -> None:
    """An app's machines: group, region, release, state and checks."""
    titles = ("ID", "GROUP", "REGION", "RELEASE", "STATE", "CHECKS", "WORKER")
    _listing(items, "machines", titles, _status_row)


def _status_row(m: Machine) -> tuple[Any, ...]:
    meta = m.config.metadata
    passing = sum(1 for c in m.checks if c.status == "passing")
    checks = f"{passing}/{len(m.checks)} passing" if m.checks else "-"
    if m.config.checks and m.state is not MachineState.STARTED:
        # Its checks run only while it is started: what they last saw says nothing now.
        checks = f"{len(m.config.checks)} not running"
    release = meta.get("souq_release")
    return (
        m.id,
        meta.get("souq_process_group", "app"),
        m.region,
        f"v{release}" if release else "-",
        _cell_state(str(m.state)),
        checks,
        m.worker_id,
    )


@_json_or
def deploy_plan(rows: Sequence[dict[str, Any]]) -> None:
    """A deploy's plan (``--dry-run``): each step, in order, and where new machines would go."""
    titles = ("PHASE", "ACTION", "GROUP", "REGION", "MACHINE", "WORKER")
    _listing(rows, "changes: the app is as souq.toml says", titles, _plan_row)


def _plan_row(r: dict[str, Any]) -> tuple[Any, ...]:
    return (
        r["phase"],
        r["action"],
        r["group"],
        r["region"],
        r.get("machine_id") or "(new)",
        r.get("worker_id") or "-",
    )
