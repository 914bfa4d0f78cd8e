"""How ``souq job ...`` prints batch jobs, and a job's line in ``souq events``: a part of
:mod:`souq.client.render` (the only printer), with its helpers."""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from typing import Any

from rich.text import Text

from souq.client.render import _grid, _json_or, _listing, _out, line
from souq.clock import iso_from_ms
from souq.model.job import Job, PeriodicJob

__all__ = [
    "age",
    "job",
    "job_state",
    "jobs",
    "periodic",
    "periodic_list",
    "periodic_state",
]

_STYLES = {
    "pending": "cyan",
    "claimed": "blue",
    "running": "green",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "dim",
}


def _state(j: Job) -> Text:
    text = str(j.state) + (" (cancel asked)" if j.cancel_requested and not j.state.ended else "")
    return Text(text, style=_STYLES.get(str(j.state), ""))


def age(since_ms: int, now_ms: int) -> str:
    """``since_ms`` to ``now_ms`` as a person reads an age: 42s, 5m, 3h, 2d."""
    seconds = max(0, (now_ms - since_ms) // 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def command(j: Job) -> str:
    cmd = j.spec.command
    return cmd if isinstance(cmd, str) else shlex.join(cmd)


@_json_or
def job_state(j: Job) -> None:
    """After a command: the job's name and its state now (and why, unless it waits)."""
    why = f"  ({j.why})" if j.why and j.why != "submitted" else ""
    line(f"{j.name} {j.state}{why}")


@_json_or
def jobs(items: Sequence[Job]) -> None:
    now = int(time.time() * 1000)
    titles = ("NAME", "STATE", "WORKER", "ATTEMPTS", "AGE", "WHY")
    _listing(items, "jobs", titles, lambda j: _row(j, now))


def _row(j: Job, now_ms: int) -> tuple[Any, ...]:
    return (j.name, _state(j), j.worker or "-", str(j.attempts), age(j.submitted_ms, now_ms), j.why)


@_json_or
def job(j: Job) -> None:
    spec = j.spec
    restart: str = spec.restart
    if restart == "on-failure":
        restart += f" (at most {spec.max_retries} retries, backoff {spec.backoff_s:g}s doubling)"
    rows: list[tuple[str, Any]] = [
        ("name", j.name),
        ("state", _state(j)),
        ("why", j.why),
        ("worker", j.worker or "-"),
        ("attempts", str(j.attempts)),
        ("command", command(j)),
        ("restart", restart),
        ("needs", f"{spec.cpus:g} cpus, {spec.memory_mb} MiB"),
        ("submitted", iso_from_ms(j.submitted_ms)),
        ("updated", iso_from_ms(j.updated_ms)),
    ]
    if j.periodic is not None and j.scheduled_ms is not None:
        rows.append(("periodic", f"{j.periodic}, due at {iso_from_ms(j.scheduled_ms)}"))
    if spec.deadline_s is not None and j.deadline_ms is not None:
        rows.append(("deadline", f"{iso_from_ms(j.deadline_ms)} ({spec.deadline_s:g}s)"))
    if spec.env:
        rows.append(("env", " ".join(f"{k}={v}" for k, v in sorted(spec.env.items()))))
    for name, ms in (("started", j.started_ms), ("finished", j.finished_ms)):
        if ms is not None:
            rows.append((name, iso_from_ms(ms)))
    if j.exit_code is not None:
        rows.append(("exit code", str(j.exit_code)))
    if j.error:
        rows.append(("error", j.error))
    _out().print(_grid(rows, bold_names=True))


def _next(p: PeriodicJob) -> str:
    return "-" if p.next_ms is None else iso_from_ms(p.next_ms)


@_json_or
def periodic_state(p: PeriodicJob) -> None:
    """After a submit with ``--cron``: its name, its schedule in words, its next time."""
    line(f"{p.name} periodic: {p.explained}; next run at {_next(p)}")


@_json_or
def periodic_list(items: Sequence[PeriodicJob]) -> None:
    titles = ("NAME", "SCHEDULE", "NEXT", "LAST RUN", "WHY")
    _listing(items, "periodic jobs", titles, _periodic_row)


def _periodic_row(p: PeriodicJob) -> tuple[Any, ...]:
    last = p.runs[0] if p.runs else None
    run = "-" if last is None else (last.job or "skipped")
    return (p.name, p.explained, _next(p), run, "" if last is None else last.why)


@_json_or
def periodic(p: PeriodicJob) -> None:
    spec = p.spec
    rows: list[tuple[str, Any]] = [
        ("name", p.name),
        ("schedule", f"{spec.cron} ({spec.time_zone or 'UTC'}): {p.explained}"),
        ("overlap", "prohibited" if spec.prohibit_overlap else "allowed"),
        ("command", command_of(spec.command)),
        ("next", _next(p)),
        ("created", iso_from_ms(p.created_ms)),
    ]
    for run in p.runs:
        rows.append((iso_from_ms(run.at_ms), f"{run.job or 'skipped'}: {run.why}"))
    _out().print(_grid(rows, bold_names=True))


def command_of(cmd: str | list[str]) -> str:
    return cmd if isinstance(cmd, str) else shlex.join(cmd)
