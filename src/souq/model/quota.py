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
from typing import Any, Literal

import msgspec
from pydantic import Field, PrivateAttr

from souq.model.base import Input, Record
from souq.model.choices import PriorityClass
from souq.model.quota_sums import (
    Held,
    Part,
    Sums,
    held_part,
    moved,
    pending_part,
    summed,
    volume_part,
)

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
    "encoded",
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
    # Derived, never written: the ledger's running sums (souq.model.quota_sums) and the JSON of
    # ``held`` (with the dict it encodes), so that a change neither sums nor encodes it all.
    _sums: Sums | None = PrivateAttr(default=None)
    _held_json: tuple[dict[str, Held], dict[str, msgspec.Raw]] | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QuotaRecord):
            return NotImplemented
        return self.__dict__ == other.__dict__  # the fields, not what is derived from them

    __hash__ = None  # type: ignore[assignment]


_ENCODER = msgspec.json.Encoder()


def _derived(record: QuotaRecord) -> dict[str, Any]:
    """``record``'s private attributes (its sums, its held machines' JSON), read and written
    straight (pydantic's attribute lookup for them costs more than the sums they save)."""
    private = record.__pydantic_private__
    assert private is not None
    return private


def _sums_of(record: QuotaRecord) -> Sums:
    sums = _derived(record).get("_sums")
    if sums is None or not sums.made_of(record.pending, record.held, record.volumes):
        sums = summed(record.pending, record.held, record.volumes)
        _derived(record)["_sums"] = sums
    return sums


def _with_sums(
    new: QuotaRecord, old: QuotaRecord, plus: list[Part], minus: list[Part]
) -> QuotaRecord:
    _derived(new)["_sums"] = moved(_sums_of(old), (new.pending, new.held, new.volumes), plus, minus)
    return new


def _held_json(record: QuotaRecord) -> dict[str, msgspec.Raw]:
    """Each held machine's JSON, by id (``record.held`` as the bucket stores it, encoded)."""
    cached = _derived(record).get("_held_json")
    if cached is None or cached[0] is not record.held:
        cached = (record.held, {key: _raw(size) for key, size in record.held.items()})
        _derived(record)["_held_json"] = cached
    return cached[1]


def _raw(size: Held) -> msgspec.Raw:
    return msgspec.Raw(_ENCODER.encode(size))


def encoded(record: QuotaRecord) -> bytes:
    """``record`` as the quotas bucket stores it (JSON; ``QuotaRecord.model_validate_json``
    reads it), its held machines' JSON reused from the changes that made them (embedded as
    :class:`msgspec.Raw`, not encoded again)."""
    fields = record.model_dump(mode="json", exclude={"held"})
    fields["held"] = _held_json(record)
    return _ENCODER.encode(fields)


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
    millicpus, memory_mb, machines, volume_gb = _sums_of(record).total
    return QuotaUse(
        cpus=millicpus / 1000, memory_mb=memory_mb, machines=machines, volume_gb=volume_gb
    )


def use_of_class(record: QuotaRecord, klass: str) -> QuotaUse:
    """What ``record``'s machines of class ``klass`` hold, changes under way included."""
    millicpus, memory_mb, machines, _ = _sums_of(record).by_class.get(klass, (0, 0, 0, 0))
    return QuotaUse(cpus=millicpus / 1000, memory_mb=memory_mb, machines=machines)


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
    new = record.model_copy(update={"pending": {**record.pending, entry.request_id: entry}})
    old = record.pending.get(entry.request_id)
    minus = [] if old is None else [pending_part(old)]
    return _with_sums(new, record, [pending_part(entry)], minus)


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
    minus = [] if entry is None else [pending_part(entry)]
    plus: list[Part] = []
    kept = dict(record.held)
    for machine_id, use in machines.items():
        size: Held = (use.cpus, use.memory_mb, klass)
        if machine_id in kept:
            minus.append(held_part(kept[machine_id]))
        kept[machine_id] = size
        plus.append(held_part(size))
    update: dict[str, object] = {"pending": pending, "held": kept}
    if volumes:
        update["volumes"] = {**record.volumes, **volumes}
        for volume_id, size_gb in volumes.items():
            if volume_id in record.volumes:
                minus.append(volume_part(record.volumes[volume_id]))
            plus.append(volume_part(size_gb))
    new = _with_sums(record.model_copy(update=update), record, plus, minus)
    cached = _derived(record).get("_held_json")
    if cached is not None and cached[0] is record.held:
        # What it held keeps its JSON; only the machines of this change are encoded.
        parts = dict(cached[1])
        for machine_id in machines:
            parts[machine_id] = _raw(kept[machine_id])
        _derived(new)["_held_json"] = (kept, parts)
    return new


def released(record: QuotaRecord, keys: Iterable[str]) -> QuotaRecord:
    """``record`` without the machines, volumes (or changes) of ``keys``."""
    gone = set(keys)
    minus = [pending_part(e) for k, e in record.pending.items() if k in gone]
    minus += [held_part(h) for k, h in record.held.items() if k in gone]
    minus += [volume_part(s) for k, s in record.volumes.items() if k in gone]
    new = record.model_copy(
        update={
            "pending": {k: e for k, e in record.pending.items() if k not in gone},
            "held": {k: h for k, h in record.held.items() if k not in gone},
            "volumes": {k: s for k, s in record.volumes.items() if k not in gone},
        }
    )
    return _with_sums(new, record, [], minus)


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
