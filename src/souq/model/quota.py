"""Quotas: how much an app (or an organization, over all its apps) may hold, and the ledger of
what it holds. Pure: no I/O (the ledger's store is :mod:`souq.broker.quotas`; reconciling it with
the cluster is :mod:`souq.model.quota_reconcile`).

A scope's limits are lines: one for all classes (``cpus``, ``memory_mb``, ``machines``,
``volume_gb``) and one per priority class (``classes: {reserved|standard|spot: {cpus,
memory_mb, machines}}``; volumes have no class). A create must fit both the all-classes line
and its own class's.

A scope's record (``QuotaRecord``) keeps its limits beside its ledger, so that one
compare-and-set on one key both checks and takes: every entry is a machine (or a batch's
machines, or a volume) counted against the limits —

* **pending**: reserved by a broker for a change under way (a create, a batch, an update's
  growth, a volume's create or extension), keyed by its request id, with a ``deadline_ms``.
  Answered, it becomes held (or is dropped, refused).
* **held**: machines keyed by id (their size and class only: the whole record is written at
  every change), volumes keyed by id (their size); a destroy drops it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from souq.model.base import Input, Record
from souq.model.choices import PriorityClass

__all__ = [
    "ALL_CLASSES",
    "BATCH_MARK",
    "CLASSES",
    "CLASS_DIMENSIONS",
    "DIMENSIONS",
    "ClassLimits",
    "Excess",
    "Held",
    "QuotaEntry",
    "QuotaLimits",
    "QuotaRecord",
    "QuotaUse",
    "QuotaView",
    "Scope",
    "class_of",
    "excess",
    "held",
    "released",
    "reserved",
    "use_of",
    "use_of_class",
    "use_of_record",
    "view_of",
    "with_line",
]

Scope = Literal["app", "org"]
CLASSES = tuple(c.value for c in PriorityClass)
ALL_CLASSES = "all"  # the line of limits over every class
DIMENSIONS = ("cpus", "memory_mb", "machines", "volume_gb")
CLASS_DIMENSIONS = ("cpus", "memory_mb", "machines")  # volumes have no priority class
_UNITS = {"cpus": "cpus", "memory_mb": "MiB", "machines": "machines", "volume_gb": "GB"}


class ClassLimits(Input):
    """One priority class's limits (``classes.<class>`` of a quota, or
    ``PUT .../quota/<class>``); a field left out (or null) has none."""

    cpus: float | None = Field(default=None, ge=0, description="CPU cores over all machines")
    memory_mb: int | None = Field(default=None, ge=0, description="memory in MiB over all")
    machines: int | None = Field(default=None, ge=0, description="machines not destroyed")


class AllLimits(ClassLimits):
    """The limits over every class (``PUT .../quota/all``), volumes' size included."""

    volume_gb: int | None = Field(
        default=None, ge=0, description="the size of the volumes not destroyed, in GB"
    )


class QuotaLimits(AllLimits):
    """``PUT /v1/apps/{app}/quota`` (and ``/v1/orgs/{org}/quota``): the limits over all classes
    and per class; a field left out (or null) has none. A PUT replaces them as a whole."""

    classes: dict[PriorityClass, ClassLimits] = Field(
        default_factory=dict, description="limits of one priority class's machines only"
    )


def with_line(limits: QuotaLimits, line: str, given: ClassLimits) -> QuotaLimits:
    """``limits`` with one line (``all`` or a class) replaced by ``given``."""
    if line == ALL_CLASSES:
        return QuotaLimits(**given.model_dump(), classes=limits.classes)
    classes = dict(limits.classes)
    klass = PriorityClass(line)
    if all(getattr(given, d) is None for d in CLASS_DIMENSIONS):
        classes.pop(klass, None)  # no limit left on the class: no line
    else:
        classes[klass] = ClassLimits(**given.model_dump())
    return limits.model_copy(update={"classes": classes})


class QuotaUse(Record):
    """What a scope holds (pending reservations included), per dimension."""

    cpus: float = 0.0
    memory_mb: int = 0
    machines: int = 0
    volume_gb: int = 0

    def plus(self, other: QuotaUse) -> QuotaUse:
        return QuotaUse(
            cpus=round(self.cpus + other.cpus, 3),
            memory_mb=self.memory_mb + other.memory_mb,
            machines=self.machines + other.machines,
            volume_gb=self.volume_gb + other.volume_gb,
        )

    def growth_to(self, after: QuotaUse) -> QuotaUse:
        """What ``after`` asks beyond this, per dimension (a shrink asks nothing)."""
        return QuotaUse(
            cpus=max(0.0, round(after.cpus - self.cpus, 3)),
            memory_mb=max(0, after.memory_mb - self.memory_mb),
            machines=max(0, after.machines - self.machines),
            volume_gb=max(0, after.volume_gb - self.volume_gb),
        )

    def is_zero(self) -> bool:
        return not (self.cpus > 0 or self.memory_mb or self.machines or self.volume_gb)


class QuotaEntry(Record):
    """One change's share of a scope's use, under way."""

    app: str
    request_id: str = Field(description="the create (or update, extension) that asks it")
    use: QuotaUse
    deadline_ms: int | None = Field(default=None, description="pending until then")
    priority_class: str = Field(default="", description="its machines' class ('': standard)")
    class_use: QuotaUse | None = Field(
        default=None,
        description="what it counts in its class when not ``use`` (an update "
        "that moves a machine to another class counts all of it there)",
    )


Held = tuple[float, int, str]  # a machine's (cpus, memory_mb, priority class): compact on purpose


class QuotaRecord(Record):
    """One key of the quotas bucket: a scope's limits and ledger."""

    scope: Scope
    name: str
    limits: QuotaLimits
    pending: dict[str, QuotaEntry] = Field(
        default_factory=dict, description="changes under way, by request id"
    )
    held: dict[str, Held] = Field(
        default_factory=dict, description="machines counted: id → (cpus, memory_mb, class)"
    )
    volumes: dict[str, int] = Field(default_factory=dict, description="volumes: id → size_gb")


class QuotaView(Record):
    """``GET .../quota``: the limits, the use (pending included), the pending part, and the use
    of each class."""

    scope: Scope
    name: str
    limits: QuotaLimits
    use: QuotaUse
    pending: QuotaUse
    pending_creates: int
    use_by_class: dict[str, QuotaUse] = Field(default_factory=dict)


@dataclass(frozen=True)
class Excess:
    """The first limit a change would pass."""

    scope: Scope
    name: str
    dimension: str
    limit: float
    use: float
    asked: float
    priority_class: str = ALL_CLASSES

    @property
    def quota(self) -> str:
        """The quota's name: ``cpus``, or ``spot.cpus`` for a class's line."""
        if self.priority_class == ALL_CLASSES:
            return self.dimension
        return f"{self.priority_class}.{self.dimension}"

    def message(self) -> str:
        unit = _UNITS[self.dimension]
        line = "" if self.priority_class == ALL_CLASSES else f"{self.priority_class} "
        return (
            f"{self.scope} {self.name} is over its {line}{self.dimension} quota: limit "
            f"{_num(self.limit)} {unit}, in use {_num(self.use)}, this asks "
            f"{_num(self.asked)} more"
        )


def _num(value: float) -> str:
    return f"{value:g}"


def class_of(name: str) -> str:
    """An entry's class as counted: ``''`` (a ledger from before classes) is ``standard``."""
    return name or PriorityClass.STANDARD.value


def use_of(
    entries: Iterable[QuotaEntry], held: Iterable[Held] = (), volumes: Iterable[int] = ()
) -> QuotaUse:
    """The sum of ``entries``, ``held`` machines and ``volumes``' sizes."""
    cpus, memory_mb, machines, volume_gb = 0.0, 0, 0, 0
    for entry in entries:
        use = entry.use
        cpus += use.cpus
        memory_mb += use.memory_mb
        machines += use.machines
        volume_gb += use.volume_gb
    for machine_cpus, machine_memory, _ in held:
        cpus += machine_cpus
        memory_mb += machine_memory
        machines += 1
    volume_gb += sum(volumes)
    return QuotaUse(
        cpus=round(cpus, 3), memory_mb=memory_mb, machines=machines, volume_gb=volume_gb
    )


def use_of_record(record: QuotaRecord) -> QuotaUse:
    """What ``record``'s scope holds, its changes under way included."""
    return use_of(record.pending.values(), record.held.values(), record.volumes.values())


def use_of_class(record: QuotaRecord, klass: str) -> QuotaUse:
    """What ``record``'s machines of class ``klass`` hold, changes under way included."""
    entries = [
        e if e.class_use is None else e.model_copy(update={"use": e.class_use})
        for e in record.pending.values()
        if class_of(e.priority_class) == klass
    ]
    machines = [h for h in record.held.values() if class_of(h[2]) == klass]
    use = use_of(entries, machines)
    return use.model_copy(update={"volume_gb": 0})


def _over(
    limits: ClassLimits, dimensions: tuple[str, ...], use: QuotaUse, asked: QuotaUse
) -> tuple[str, float, float, float] | None:
    for dimension in dimensions:
        limit = getattr(limits, dimension)
        want = getattr(asked, dimension)
        if limit is None or want <= 0:
            continue
        have = getattr(use, dimension)
        if have + want > limit + 1e-9:
            return dimension, limit, have, want
    return None


def excess(
    record: QuotaRecord,
    asked: QuotaUse,
    priority_class: str = "",
    class_asked: QuotaUse | None = None,
) -> Excess | None:
    """The first limit of ``record`` that its use plus ``asked`` would pass — the all-classes
    line's, then the line of ``priority_class`` (with ``class_asked``, when the change asks its
    class another amount than all: an update moving a machine between classes); None: it
    fits."""
    over = _over(record.limits, DIMENSIONS, use_of_record(record), asked)
    if over is not None:
        return Excess(record.scope, record.name, *over)
    klass = class_of(priority_class)
    line = record.limits.classes.get(PriorityClass(klass))
    if line is None:
        return None
    in_class = asked if class_asked is None else class_asked
    over = _over(line, CLASS_DIMENSIONS, use_of_class(record, klass), in_class)
    if over is not None:
        return Excess(record.scope, record.name, *over, priority_class=klass)
    return None


def reserved(record: QuotaRecord, entry: QuotaEntry) -> QuotaRecord:
    """``record`` with ``entry`` pending under its request id."""
    return record.model_copy(update={"pending": {**record.pending, entry.request_id: entry}})


def held(
    record: QuotaRecord,
    request_id: str,
    machines: Mapping[str, QuotaUse],
    volumes: Mapping[str, int] | None = None,
) -> QuotaRecord:
    """The pending ``request_id`` turned into what it made: one held machine per machine (its
    size as given: a create's, an update's new one), each volume at its size; none made: it is
    dropped."""
    pending = dict(record.pending)
    entry = pending.pop(request_id, None)
    klass = entry.priority_class if entry else ""
    kept = dict(record.held)
    for machine_id, use in machines.items():
        kept[machine_id] = (use.cpus, use.memory_mb, klass)
    update: dict[str, object] = {"pending": pending, "held": kept}
    if volumes:
        update["volumes"] = {**record.volumes, **volumes}
    return record.model_copy(update=update)


def released(record: QuotaRecord, keys: Iterable[str]) -> QuotaRecord:
    """``record`` without the machines, volumes (or changes) of ``keys``."""
    gone = set(keys)
    return record.model_copy(
        update={
            "pending": {k: e for k, e in record.pending.items() if k not in gone},
            "held": {k: h for k, h in record.held.items() if k not in gone},
            "volumes": {k: s for k, s in record.volumes.items() if k not in gone},
        }
    )


def view_of(record: QuotaRecord) -> QuotaView:
    pending = list(record.pending.values())
    return QuotaView(
        scope=record.scope,
        name=record.name,
        limits=record.limits,
        use=use_of_record(record),
        pending=use_of(pending),
        pending_creates=len(pending),
        use_by_class={klass: use_of_class(record, klass) for klass in CLASSES},
    )


BATCH_MARK = "~b"  # a batch's request id ends so; its machines' add "-<index>"
