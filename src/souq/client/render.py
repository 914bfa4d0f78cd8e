"""The only module of Souq that prints: rich tables for people, JSON with ``--json``.

Everything else returns data; the CLI hands it here. Output goes to stdout, errors to stderr.
Markup is off everywhere: commands, names and messages are printed as they are.
"""

from __future__ import annotations

import functools
import json
import shlex
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TextIO, TypeVar

from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from souq.clock import iso_from_ms
from souq.errors import InsufficientCapacity, SouqError
from souq.model.choices import EventType

if TYPE_CHECKING:  # records load as a command reads them; the simulator's (numpy) with `simulate`
    from souq.model import Machine, MachineEvent, OpRecord, Placement, Quote, WorkerInfo
    from souq.model.image import ImageRecord
    from souq.model.secrets import SecretInfo
    from souq.model.tokens import AuditRecord, TokenInfo
    from souq.sim.whatif import WhatIf

__all__ = [
    "error",
    "events",
    "image_reference",
    "images",
    "job_event_line",
    "json_value",
    "line",
    "logs",
    "machine",
    "machine_id",
    "machine_state",
    "machines",
    "ops",
    "record",
    "workers",
]

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)

_STATE_STYLES = {
    "started": "green",
    "up": "green",
    "starting": "cyan",
    "stopping": "yellow",
    "stopped": "yellow",
    "suspended": "blue",
    "cordoned": "yellow",
    "draining": "yellow",
    "created": "blue",
    "failed": "red",
    "down": "red",
    "destroying": "magenta",
    "destroyed": "dim",
}


def _console(stream: TextIO) -> Console:
    # Piped output is read by programs and people's tools: never cut it to a terminal's width.
    width = None if stream.isatty() else 1000
    return Console(file=stream, width=width, markup=False, highlight=False, emoji=False)


def _out() -> Console:
    return _console(sys.stdout)


def _err() -> Console:
    return _console(sys.stderr)


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if callable(getattr(value, "as_json", None)):  # a report that says its JSON shape
        return value.as_json()
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def json_value(value: Any) -> None:
    """``value`` (a model, a list of models, or plain data) as indented JSON on stdout."""
    sys.stdout.write(json.dumps(_jsonable(value), indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


class _View(Protocol[T_contra]):
    def __call__(self, value: T_contra, /, *, as_json: bool = False) -> None: ...


def _json_or(text: Callable[[T], None]) -> _View[T]:
    """A view of a value: with ``--json`` the value as JSON (:func:`json_value`), else what
    ``text`` prints for people."""

    @functools.wraps(text)
    def view(value: T, /, *, as_json: bool = False) -> None:
        if as_json:
            json_value(value)
        else:
            text(value)

    return view


def _listing(
    items: Sequence[T], what: str, titles: tuple[str, ...], row: Callable[[T], tuple[Any, ...]]
) -> None:
    """A table of ``items``, one ``row`` each, every column but the last on one line; ``no
    <what>`` on stderr when there are none."""
    if not items:
        _err().print(f"no {what}")
        return
    table = Table(box=None, pad_edge=False)
    for title in titles:
        table.add_column(title, no_wrap=title != titles[-1], min_width=len(title))
    for item in items:
        table.add_row(*row(item))
    _out().print(table)


def _grid(rows: Iterable[tuple[str, Any]], *, bold_names: bool = False) -> Table:
    """One record: a name and its value a line."""
    grid = Table.grid(padding=(0, 2))
    if bold_names:
        grid.add_column(style="bold")
        grid.add_column()
    for name, value in rows:
        grid.add_row(name, value)
    return grid


@_json_or
def record(value: BaseModel) -> None:
    """A record's fields, a line each (what an operation that names no view of its own shows)."""
    _out().print(_grid((name, str(getattr(value, name))) for name in type(value).model_fields))


def line(text: str) -> None:
    """One plain line on stdout."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def note(text: str) -> None:
    """One plain line on stderr: what a command did, beside its answer on stdout."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def logs(chunk: str, *, as_json: bool = False) -> None:
    """Machine output exactly as it came; with ``--json`` one ``{"data": ...}`` line per chunk."""
    if as_json:
        chunk = json.dumps({"data": chunk}, ensure_ascii=False) + "\n"
    sys.stdout.write(chunk)
    sys.stdout.flush()


@_json_or
def machine_id(m: Machine) -> None:
    line(m.id)


@_json_or
def machine_state(m: Machine) -> None:
    """After a command: the machine's id and the state it is in now."""
    line(f"{m.id} {m.state}")


@_json_or
def machines(items: Sequence[Machine]) -> None:
    titles = ("ID", "NAME", "STATE", "REGION", "WORKER", "CPUS", "MEMORY", "CREATED", "CMD")
    _listing(items, "machines", titles, _machine_row)


def _machine_row(m: Machine) -> tuple[Any, ...]:
    guest = m.config.guest
    return (
        m.id,
        m.name,
        _cell_state(m.state),
        m.region,
        m.worker_id,
        f"{guest.cpus:g}",
        f"{guest.memory_mb} MiB",
        m.created_at,
        shlex.join(m.config.cmd),
    )


def _cell_state(state: str) -> Text:
    return Text(str(state), style=_STATE_STYLES.get(str(state), ""))


@_json_or
def machine(m: Machine) -> None:
    config = m.config
    rows: list[tuple[str, Any]] = [
        ("id", m.id),
        ("name", m.name),
        ("app", m.app),
        ("state", _cell_state(m.state)),
        ("region", m.region),
        ("worker", m.worker_id),
        ("cmd", shlex.join(config.cmd)),
        ("guest", f"{config.guest.cpus:g} cpus, {config.guest.memory_mb} MiB"),
        ("restart", _restart(m)),
        (
            "stop",
            f"{config.stop_config.signal}, then SIGKILL after {config.stop_config.timeout_s:g}s",
        ),
        ("created", m.created_at),
        ("updated", m.updated_at),
    ]
    bid = "" if config.max_price is None else f", bids at most {config.max_price:g}"
    rows.append(("class", f"{config.priority_class}{bid}"))
    preempted = next((e for e in m.events if e.type == EventType.PREEMPTED), None)
    if preempted is not None and m.state in ("stopping", "stopped"):
        rows.append(("reason", preempted.message or "preempted"))
    latest = m.events[0] if m.events else None  # newest first
    if latest is not None and latest.type == EventType.PREEMPT_NOTICE and m.state == "started":
        rows.append(("notice", latest.message or "preempted soon"))
    if config.env:
        rows.append(("env", " ".join(f"{k}={v}" for k, v in sorted(config.env.items()))))
    if m.address is not None and m.address.private_ip:
        rows.append(("private ip", f"{m.address.private_ip} ({m.address.network})"))
    if m.pid is not None:
        rows.append(("pid", str(m.pid)))
    if m.exit_code is not None:
        rows.append(("exit code", str(m.exit_code)))
    console = _out()
    console.print(_grid(rows, bold_names=True))
    if m.events:
        console.print()
        console.print(_events_table(m.events[:10]))
    if m.placement is not None:
        console.print()
        _print_placement(console, m.placement)


def _restart(m: Machine) -> str:
    restart = m.config.restart
    text = str(restart.policy)
    if restart.policy == "on-failure":
        text += f" (at most {restart.max_retries} times)"
    if m.restarts:
        text += f"; restarted {m.restarts} times"
    return text


def _events_table(items: Sequence[MachineEvent]) -> Table:
    table = Table(box=None, pad_edge=False, title="events (newest first)", title_justify="left")
    for title in ("TIME", "TYPE", "STATUS", "SOURCE", "DETAIL"):
        table.add_column(title, no_wrap=title != "DETAIL")
    for e in items:
        detail = []
        if e.exit_code is not None:
            detail.append(f"exit code {e.exit_code}")
        if e.signal:
            detail.append(e.signal)
        if e.message:
            detail.append(e.message)
        table.add_row(
            iso_from_ms(e.timestamp), e.type, _cell_state(e.status), e.source, "; ".join(detail)
        )
    return table


@_json_or
def ops(items: Sequence[OpRecord]) -> None:
    """A machine's op log, oldest first."""
    table = Table(box=None, pad_edge=False, title="op log (oldest first)", title_justify="left")
    for title in ("TIME", "OP", "KIND", "STATE", "EVENT"):
        table.add_column(title, no_wrap=True)
    for step in items:
        table.add_row(iso_from_ms(step.timestamp), step.op_id, step.kind, step.state, step.event)
    _out().print(table)


@_json_or
def events(items: Sequence[MachineEvent]) -> None:
    _out().print(_events_table(items))


def job_event_line(event: dict[str, Any], when: str) -> str:
    """A job event of ``souq events``: ``seq time job NAME worker=W before -> state (type)``."""
    note = event.get("job") or {}
    worker = f" worker={event['worker_id']}" if event.get("worker_id") else ""
    return (
        f"{event['seq']:>6} {when} job     {note.get('name', '?')}{worker} "
        f"{event.get('previous') or '-'} -> {event['state']} ({note.get('type', '')}: "
        f"{note.get('why', '')})"
    )


def cluster_event(event: dict[str, Any], *, as_json: bool = False) -> None:
    """One event of ``souq events``: a JSON line, or ``seq time kind who state detail``."""
    if as_json or event["kind"] == "gap":
        line(json.dumps(event, ensure_ascii=False) if as_json else f"  --- gap: {event['message']}")
        return
    when = iso_from_ms(int(event["timestamp"]))
    if event["kind"] == "machine":
        detail = event.get("event") or {}
        line(
            f"{event['seq']:>6} {when} machine {event['machine_id']} app={event['app']} "
            f"worker={event['worker_id']} {event['state']} ({detail.get('type', '')})"
        )
    elif event["kind"] == "job":
        line(job_event_line(event, when))
    else:
        line(
            f"{event['seq']:>6} {when} worker  {event['worker_id']} region={event['region']} "
            f"{event.get('previous') or '-'} -> {event['state']}"
        )


def _print_placement(console: Console, p: Placement) -> None:
    head = (
        f"placement ({p.policy}): {p.offers_received} of {p.expected_offers} workers offered"
        f" in {p.timings.gather_ms:g} ms; total {p.timings.total_ms:g} ms"
    )
    console.print(head)
    if p.winner:
        runner_up = f", runner-up {p.runner_up}" if p.runner_up else ""
        console.print(f"winner {p.winner}{runner_up}")
    if p.rejections:
        rejected = ", ".join(f"{n} {reason}" for reason, n in sorted(p.rejections.items()))
        console.print(f"rejected: {rejected}")
    if p.preemption is not None:
        pre = p.preemption
        console.print(
            f"preemption: {pre.reason}; {pre.priority_class} may displace "
            f"{', '.join(pre.displaces) or 'nothing'} (at most {pre.max_victims} machines)"
        )
    for v in p.preempted:
        price = "no limit" if v.max_price is None else f"{v.max_price:g}"
        console.print(
            f"displaced {v.machine_id} (app {v.app}, {v.priority_class}, bid {price}, "
            f"{v.cpus:g} cpus / {v.memory_mb} MiB)"
        )
    if p.offers:
        table = Table(box=None, pad_edge=False)
        gpus = any(o.gpu_free is not None for o in p.offers)  # a GPU request: their free state
        titles = ("WORKER", "SCORE", "SCORES", "GPUS FREE", "REJECTED")
        for title in titles if gpus else (t for t in titles if t != "GPUS FREE"):
            table.add_column(title)
        for o in p.offers:
            scores = " ".join(f"{k}={v:.3f}" for k, v in o.scores.items())
            score = "" if o.score is None else f"{o.score:.3f}"
            rejected = f"{o.rejected}: {o.detail}" if o.rejected else ""
            if o.preempts:
                rejected = f"would displace {o.preempts}"
            free = [",".join(str(f) for f in o.gpu_free or ())] if gpus else []
            table.add_row(o.worker_id, score, scores, *free, rejected)
        console.print(table)
    refused = [c for c in p.claims if not c.ok]
    for c in refused:
        console.print(f"claim on {c.worker_id} failed: {c.reason}")


@_json_or
def placement(p: Placement) -> None:
    """A placement record in full: offers, per-stage scores, rejections, claims, timings."""
    console = _out()
    _print_placement(console, p)
    t = p.timings
    console.print(
        f"timings: gather {t.gather_ms:g} ms, rank {t.rank_ms:g} ms, claim {t.claim_ms:g} ms"
    )


@_json_or
def quote(q: Quote) -> None:
    rows = [
        ("id", q.id),
        ("state", q.state.value),
        ("app", q.app),
        ("region", q.region),
        ("worker", q.worker_id),
        ("holds", f"{q.resources.cpus:g} cpus, {q.resources.memory_mb} MiB"),
        ("expires", q.expires_at),
        ("machine", q.machine_id or ""),
    ]
    console = _out()
    console.print(_grid(rows))
    if q.placement is not None:
        console.print()
        _print_placement(console, q.placement)


@_json_or
def image_reference(record: ImageRecord) -> None:
    """After a build or an import: the image's reference, what `--image` takes."""
    line(record.reference)


@_json_or
def images(items: Sequence[ImageRecord]) -> None:
    titles = ("REFERENCE", "NAME", "SIZE", "LAYERS", "CREATED", "CMD")
    _listing(items, "images", titles, _image_row)


def _image_row(r: ImageRecord) -> tuple[Any, ...]:
    return (
        r.reference[: len("sha256:") + 12],
        r.name or "",
        f"{r.size / 2**20:.1f} MiB",
        str(len(r.layers)),
        r.created_at,
        " ".join(r.run.cmd),
    )


@_json_or
def workers(items: Sequence[WorkerInfo]) -> None:
    titles = ("ID", "REGION", "STATE", "CPUS", "MEMORY", "MACHINES", "ISOLATION", "LABELS")
    _listing(items, "workers", titles, _worker_row)


def _isolation(w: WorkerInfo) -> str:
    """How the worker runs a machine that names no driver: isolated, or not and why."""
    fp = w.fingerprint
    if fp is None:
        return "?"
    if fp.isolation.get("default_driver") == "sandbox":
        namespaces = str(fp.isolation.get("namespaces", ""))
        if fp.isolation.get("private_network") is True:
            namespaces += ",net: private network"
            if fp.underlay:
                how = "encrypted, " if fp.underlay_key else ""
                if fp.underlay_link:
                    how = f"over its link to {fp.underlay_link}, else "
                namespaces += f", routed from other workers ({how}to {fp.underlay})"
        elif "private_network_why_not" in fp.isolation:
            namespaces += f"; no private network: {fp.isolation['private_network_why_not']}"
        return f"sandbox ({namespaces})"
    return f"none: {fp.isolation.get('why_not', 'exec only')}"


def _worker_row(w: WorkerInfo) -> tuple[Any, ...]:
    return (
        w.id,
        w.region,
        _cell_state(w.state),
        f"{w.allocated.cpus:g}/{w.capacity.cpus:g}",
        f"{w.allocated.memory_mb}/{w.capacity.memory_mb} MiB",
        str(w.machines),
        _isolation(w),
        ",".join(f"{k}={v}" for k, v in sorted(w.labels.items())),
    )


def error(err: SouqError, *, as_json: bool = False) -> None:
    """An error on stderr: its message and hint (and, for a refused placement, why)."""
    if as_json:
        sys.stderr.write(json.dumps(err.to_body(), indent=2, ensure_ascii=False) + "\n")
        sys.stderr.flush()
        return
    console = _err()
    console.print(f"error: {err.message}", style="red")
    if err.hint:
        console.print(f"hint: {err.hint}")
    if isinstance(err, InsufficientCapacity) and isinstance(err.details.get("placement"), dict):
        try:
            from souq.model.placement import Placement

            record = Placement.model_validate(err.details["placement"])
        except ValidationError:
            return
        _print_placement(console, record)


@_json_or
def secrets(items: Sequence[SecretInfo]) -> None:
    _listing(items, "secrets", ("NAME", "DIGEST", "SET"), lambda i: (i.name, i.digest, i.set_at))


@_json_or
def token_info(t: TokenInfo) -> None:
    rows = [
        ("token", t.id + (f" (narrowed {t.narrowed} times)" if t.narrowed else "")),
        ("name", t.name or "-"),
        ("app", "every app and the cluster" if t.app == "*" else t.app),
        ("scope", t.scope),
        ("expires", t.expires_at or "never"),
    ]
    _out().print(_grid(rows, bold_names=True))


@_json_or
def audit(items: Sequence[AuditRecord]) -> None:
    titles = ("TIME", "TOKEN", "CALL", "STATUS", "NAME")
    _listing(items, "audit entries", titles, _audit_row)


def _audit_row(r: AuditRecord) -> tuple[Any, ...]:
    return (
        iso_from_ms(r.at_ms),
        r.token,
        f"{r.method} {r.path}",
        str(r.status),
        r.token_name,
    )


@_json_or
def what_if(w: WhatIf) -> None:
    """Each planned machine: where it would go, with the record of its dry run (as `machine
    run --dry-run` shows it), or why it would not fit; then the count."""
    for v in w.verdicts:
        where = f"worker {v.worker}" if v.worker else f"would not fit ({v.reason})"
        _out().print(f"machine {v.index} of {len(w.verdicts)} ({v.planned.describe()}): {where}")
        if v.error:
            _out().print(f"error: {v.error}", style="red")
        placement(v.placement)
        line("")
    reasons = ", ".join(f"{n} {r}" for r, n in w.reasons().items())
    skipped = f"; left out (down): {', '.join(w.skipped)}" if w.skipped else ""
    line(
        f"{w.placed} of {len(w.verdicts)} would be placed on {w.workers} workers"
        + (f"; {w.unplaced} would not fit: {reasons}" if w.unplaced else "")
        + f"{skipped}. Nothing was created."
    )
