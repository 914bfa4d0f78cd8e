"""Traces as typed records: the openb node and pod lists, and Souq's generic task trace.

The openb files are Alibaba's ``cluster-trace-gpu-v2023`` (Weng et al., "Beware of
Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX
ATC '23); ``traces/README.md`` (at the repository's root) says where they come from. The generic
format (see docs/simulator.md) is the same resources with an arrival time and a duration, so
that traces with departures can be replayed too.

Parsing is pure: ``parse_*`` take the text and the name to report it under; ``read_*`` read a
file and parse it. Every bad value raises :class:`~souq.errors.TraceInvalid` naming the file, the
line (1 is the header) and the column (by name and 1-based position).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from souq.errors import TraceInvalid
from souq.model.choices import PriorityClass
from souq.sim.classes import QOS_CLASSES, class_of_qos

if TYPE_CHECKING:
    from _csv import Reader as CsvReader

__all__ = [
    "GENERIC_COLUMNS",
    "MILLI",
    "TASK_REQUIRED",
    "Node",
    "Pod",
    "Task",
    "parse_nodes",
    "parse_pods",
    "parse_tasks",
    "read_nodes",
    "read_pods",
    "read_tasks",
    "tasks_from_pods",
    "trace_window",
]

MILLI = 1000
"""A whole GPU, in milli-GPU."""

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")
GENERIC_COLUMNS = (
    "name",
    "arrival_s",
    "duration_s",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
)
"""The generic format's columns as the first form wrote them all (see docs/simulator.md)."""
TASK_REQUIRED = ("name", "arrival_s", "memory_mib")
"""What a generic trace must have: a CPU column as well (``cpu_milli`` or ``cpus``); the rest
(``duration_s``, the GPU columns, ``instances``, ``stagger_s``, ``job``, ``priority_class`` or
``qos``, ``max_price``) may be left out."""


@dataclass(frozen=True, slots=True)
class Node:
    """A machine of the trace: capacity in millicores, MiB and whole GPUs of one model."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class Pod:
    """A task of the openb trace. ``gpu_milli`` is per GPU: a sharing pod (``num_gpu == 1``,
    ``gpu_milli < 1000``) takes part of one GPU; a ``k``-GPU pod takes ``k`` whole GPUs."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    creation_time: int = 0
    deletion_time: int | None = None
    qos: str = ""  # its QoS class as the trace gives it (LS, BE ...; souq.sim.classes)

    @property
    def gpu_request_milli(self) -> int:
        """The pod's whole GPU request in milli: ``num_gpu * gpu_milli``."""
        return self.num_gpu * self.gpu_milli

    @property
    def shares_gpu(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI


@dataclass(frozen=True, slots=True)
class Task:
    """A task of the generic trace: the pod's resources, when it arrives and how long it stays
    (``None``: it never leaves)."""

    name: str
    arrival_s: float
    duration_s: float | None
    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_spec: tuple[str, ...] = ()
    instances: int = 1  # identical machines the task asks for
    stagger_s: float = 0.0  # instance k arrives k * stagger_s after the first
    job: str = ""  # the job the task belongs to ("": a job of its own)
    priority_class: str = PriorityClass.STANDARD  # reserved, standard or spot
    max_price: float | None = None  # its bid (None: no limit)

    @property
    def last_arrival_s(self) -> float:
        return self.arrival_s + (self.instances - 1) * self.stagger_s

    def pod(self) -> Pod:
        return Pod(
            self.name,
            self.cpu_milli,
            self.memory_mib,
            self.num_gpu,
            self.gpu_milli,
            self.gpu_spec,
            int(self.arrival_s),
            None if self.duration_s is None else int(self.arrival_s + self.duration_s),
        )


T = TypeVar("T")


class _Row:
    """One CSV row with the means to read its cells and to blame one of them."""

    def __init__(self, source: str, line: int, header: dict[str, int], cells: list[str]) -> None:
        self.source, self.line, self.header, self.cells = source, line, header, cells

    def error(self, column: str, message: str) -> TraceInvalid:
        pos = self.header[column] + 1
        return TraceInvalid(
            f"{self.source}, line {self.line}, column {pos} ({column}): {message}",
            hint="fix the row or the file's format (docs/simulator.md describes it)",
            details={"file": self.source, "line": self.line, "column": column},
        )

    def text(self, column: str) -> str:
        return self.cells[self.header[column]].strip()

    def integer(self, column: str, *, low: int = 0, high: int | None = None) -> int:
        raw = self.text(column)
        try:
            value = int(raw)
        except ValueError:
            raise self.error(column, f"{raw!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise self.error(column, f"{value} is out of range (expected {bound})")
        return value

    def has(self, column: str) -> bool:
        return column in self.header

    def seconds(self, column: str, *, optional: bool, negative: bool = False) -> float | None:
        raw = self.text(column) if self.has(column) else ""
        if not raw and optional:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise self.error(column, f"{raw!r} is not a number of seconds") from None
        if not math.isfinite(value):
            raise self.error(column, f"{raw!r} is not a finite number of seconds")
        if value < 0 and not negative:
            raise self.error(column, f"{raw} is negative")
        return value

    def amount(self, column: str, scale: float = 1.0) -> int:
        """A resource amount, fractions allowed, times ``scale``, rounded up to a whole unit."""
        return math.ceil(self._from_zero(column, self.text(column), "number") * scale - 1e-9)

    def priority_class(self) -> str:
        """The row's class: its ``priority_class`` cell, else its ``qos`` mapped
        (:data:`~souq.sim.classes.QOS_CLASSES`), else ``standard`` (empty cells too)."""
        for column in ("priority_class", "qos"):
            raw = self.text(column) if self.has(column) else ""
            if not raw:
                continue
            if column == "priority_class":
                if raw not in PriorityClass.__members__.values():
                    known = ", ".join(PriorityClass)
                    raise self.error(column, f"{raw!r} is not a priority class ({known})")
                return raw
            klass = class_of_qos(raw)
            if klass is None:
                known = ", ".join(QOS_CLASSES)
                raise self.error(column, f"{raw!r} is not a QoS class this replay knows ({known})")
            return klass
        return PriorityClass.STANDARD

    def price(self, column: str) -> float | None:
        """A bid: a number from 0, or empty (no limit)."""
        raw = self.text(column) if self.has(column) else ""
        if not raw:
            return None
        return self._from_zero(column, raw, "price")

    def _from_zero(self, column: str, raw: str, what: str) -> float:
        """``raw`` as a finite number from 0, else the row's error calling it not a ``what``."""
        try:
            value = float(raw)
        except ValueError:
            raise self.error(column, f"{raw!r} is not a {what}") from None
        if not (math.isfinite(value) and value >= 0):
            raise self.error(column, f"{raw} is out of range (expected a {what} from 0)")
        return value

    def models(self, column: str) -> tuple[str, ...]:
        return tuple(m for m in (s.strip() for s in self.text(column).split("|")) if m)


def _rows(
    text: str | Iterable[str],
    source: str,
    columns: tuple[str, ...],
    *,
    one_of: tuple[tuple[str, ...], ...] = (),
) -> Iterator[_Row]:
    lines = text.splitlines() if isinstance(text, str) else text
    reader = csv.reader(lines)
    try:
        names = [n.strip() for n in next(reader)]
    except StopIteration:
        raise TraceInvalid(f"{source}: the file is empty", hint="expected a header line") from None
    missing = [c for c in columns if c not in names] + [
        " or ".join(alternatives)
        for alternatives in one_of
        if not any(a in names for a in alternatives)
    ]
    if missing:
        raise TraceInvalid(
            f"{source}, line 1: the header lacks {', '.join(missing)}",
            hint=f"expected the columns {', '.join(columns)}",
            details={"file": source, "line": 1},
        )
    header = {n: i for i, n in enumerate(names)}
    yield from _lines_as_rows(
        reader,
        source,
        header,
        width=len(names),
        width_is=f"the header has {len(names)}",
        hint="every row needs one cell per header column",
    )


def _lines_as_rows(
    reader: CsvReader,
    source: str,
    header: dict[str, int],
    *,
    width: int,
    width_is: str,
    hint: str,
) -> Iterator[_Row]:
    """The lines ``reader`` has left that are not blank, as rows of ``header``'s columns; a line
    of other than ``width`` cells raises TraceInvalid, ``width_is`` saying how many it should
    have and ``hint`` what to fix."""
    for cells in reader:
        if not cells or all(not c.strip() for c in cells):
            continue
        row = _Row(source, reader.line_num, header, cells)
        if len(cells) != width:
            raise TraceInvalid(
                f"{source}, line {row.line}: {len(cells)} cells, {width_is}",
                hint=hint,
                details={"file": source, "line": row.line},
            )
        yield row


def _gpu_request(row: _Row, num_gpu: int) -> int:
    milli = row.integer("gpu_milli", high=MILLI)
    if num_gpu == 0 and milli:
        raise row.error("gpu_milli", f"{milli} milli-GPU asked with num_gpu 0")
    if num_gpu > 0 and milli == 0:
        raise row.error("gpu_milli", "0 milli-GPU asked with num_gpu > 0")
    if num_gpu > 1 and milli != MILLI:
        raise row.error("gpu_milli", f"a {num_gpu}-GPU task must take whole GPUs (1000)")
    return milli


def parse_nodes(text: str | Iterable[str], source: str = "<nodes>") -> list[Node]:
    def node(row: _Row) -> Node:
        return Node(
            name=row.text("sn"),
            cpu_milli=row.integer("cpu_milli"),
            memory_mib=row.integer("memory_mib"),
            gpus=row.integer("gpu"),
            model=row.text("model"),
        )

    return [node(r) for r in _rows(text, source, NODE_COLUMNS)]


def parse_pods(text: str | Iterable[str], source: str = "<pods>") -> list[Pod]:
    has_times = None

    def pod(row: _Row) -> Pod:
        nonlocal has_times
        if has_times is None:
            has_times = "creation_time" in row.header and "deletion_time" in row.header
        num_gpu = row.integer("num_gpu")
        created = row.seconds("creation_time", optional=False) if has_times else 0.0
        deleted = row.seconds("deletion_time", optional=True) if has_times else None
        return Pod(
            name=row.text("name"),
            cpu_milli=row.integer("cpu_milli"),
            memory_mib=row.integer("memory_mib"),
            num_gpu=num_gpu,
            gpu_milli=_gpu_request(row, num_gpu),
            gpu_spec=row.models("gpu_spec"),
            creation_time=int(created or 0),
            deletion_time=None if deleted is None else int(deleted),
            qos=row.text("qos") if row.has("qos") else "",
        )

    return [pod(r) for r in _rows(text, source, POD_COLUMNS)]


def parse_tasks(text: str | Iterable[str], source: str = "<tasks>") -> list[Task]:
    """The generic format (docs/simulator.md, "Trace formats"): CPU in millicores
    (``cpu_milli``) or cores (``cpus``), memory in MiB, fractions rounded up; arrivals before
    the trace's start (negative) allowed; GPU columns optional (none: a CPU-only trace)."""

    def task(row: _Row) -> Task:
        num_gpu = row.integer("num_gpu") if row.has("num_gpu") else 0
        gpu_milli = _gpu_request(row, num_gpu) if row.has("gpu_milli") else MILLI * (num_gpu > 0)
        arrival = row.seconds("arrival_s", optional=False, negative=True)
        assert arrival is not None
        cpu = row.amount("cpu_milli") if row.has("cpu_milli") else row.amount("cpus", MILLI)
        instances = row.integer("instances", low=1) if row.has("instances") else 1
        stagger = row.seconds("stagger_s", optional=True) if row.has("stagger_s") else None
        return Task(
            name=row.text("name"),
            arrival_s=arrival,
            duration_s=row.seconds("duration_s", optional=True),
            cpu_milli=cpu,
            memory_mib=row.amount("memory_mib"),
            num_gpu=num_gpu,
            gpu_milli=gpu_milli,
            gpu_spec=row.models("gpu_spec") if row.has("gpu_spec") else (),
            instances=instances,
            stagger_s=stagger or 0.0,
            job=row.text("job") if row.has("job") else "",
            priority_class=row.priority_class(),
            max_price=row.price("max_price"),
        )

    rows = _rows(text, source, TASK_REQUIRED, one_of=(("cpu_milli", "cpus"),))
    return [task(r) for r in rows]


def tasks_from_pods(pods: Iterable[Pod]) -> list[Task]:
    """The openb pods as generic tasks: arrival at creation, duration until deletion; the
    class their QoS maps to (:func:`~souq.sim.classes.class_of_qos`; ``standard`` when the pod
    has none, or one the mapping does not know)."""
    return [
        Task(
            p.name,
            float(p.creation_time),
            None if p.deletion_time is None else float(p.deletion_time - p.creation_time),
            p.cpu_milli,
            p.memory_mib,
            p.num_gpu,
            p.gpu_milli,
            p.gpu_spec,
            priority_class=class_of_qos(p.qos) or PriorityClass.STANDARD,
        )
        for p in pods
    ]


def _read(path: str | Path, parse: Callable[[str, str], list[T]]) -> list[T]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceInvalid(f"{p}: cannot read the trace: {e}", details={"file": str(p)}) from e
    return parse(text, str(p))


def read_nodes(path: str | Path) -> list[Node]:
    return _read(path, parse_nodes)


def read_pods(path: str | Path) -> list[Pod]:
    return _read(path, parse_pods)


def read_tasks(path: str | Path) -> list[Task]:
    return _read(path, parse_tasks)


def trace_window(tasks: Sequence[Task]) -> tuple[float, float]:
    """The span in which a trace offers work: its first arrival to its last (the drain after
    it left out, whose length a displaced task's later run changes); to its last departure as
    the trace gives them when every task arrives at once."""
    if not tasks:
        return 0.0, 0.0
    start = min(t.arrival_s for t in tasks)
    end = max(t.last_arrival_s for t in tasks)
    if end <= start:
        end = max(t.last_arrival_s + (t.duration_s or 0.0) for t in tasks)
    return start, end
