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

Every change makes a new record, and leaves the one it was given as it was — but a draft
(:func:`drafted`), which one batch of changes (the store's group commit) owns alone: the
changes of a create change it in place, so a batch copies its ledger once, not at each change.
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
    Vec,
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
    "drafted",
    "edited",
    "encoded",
    "excess",
    "held",
    "released",
    "reserved",
    "sealed",
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
    # A draft (:func:`drafted`) is private to one batch of changes, which change it in place;
    # ``_edits`` counts them.
    _draft: bool = PrivateAttr(default=False)
    _edits: int = PrivateAttr(default=0)

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


_VEC_INDEX = {"cpus": 0, "memory_mb": 1, "machines": 2, "volume_gb": 3}


def _over(
    limits: ClassLimits, dimensions: tuple[str, ...], use: Vec, asked: QuotaUse
) -> tuple[str, float, float, float] | None:
    """The first of ``dimensions`` where ``use`` (the ledger's sums: cpus in thousandths) plus
    ``asked`` passes ``limits``."""
    for dimension in dimensions:
        limit = getattr(limits, dimension)
        if limit is None:
            continue
        want = getattr(asked, dimension)
        if want <= 0:
            continue
        have: float = use[_VEC_INDEX[dimension]]
        if dimension == "cpus":
            have /= 1000
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
    fits. Checked on the ledger's running sums (no sum, no record of use made)."""
    sums = _sums_of(record)
    over = _over(record.limits, DIMENSIONS, sums.total, asked)
    if over is not None:
        return Excess(record.scope, record.name, *over)
    klass = class_of(priority_class)
    line = record.limits.classes.get(PriorityClass(klass))
    if line is None:
        return None
    in_class = asked if class_asked is None else class_asked
    use = sums.by_class.get(klass, (0, 0, 0, 0))
    over = _over(line, CLASS_DIMENSIONS, use, in_class)
    if over is not None:
        return Excess(record.scope, record.name, *over, priority_class=klass)
    return None


def drafted(record: QuotaRecord) -> QuotaRecord:
    """A copy of ``record`` private to one batch of changes (the quota store's group commit):
    :func:`reserved` and :func:`held` change a draft in place — its dicts copied once for the
    batch, not at every change — and :func:`sealed` ends it. Any other change of a draft makes
    a new record, as of any record."""
    sums = _sums_of(record)
    new = record.model_copy(
        update={
            "pending": dict(record.pending),
            "held": dict(record.held),
            "volumes": dict(record.volumes),
        }
    )
    private = _derived(new)
    private["_sums"] = Sums((new.pending, new.held, new.volumes), sums.total, sums.by_class)
    cached = _derived(record).get("_held_json")
    spliced = cached is not None and cached[0] is record.held
    # (Its own dict of the JSON: held changes the draft's in place.)
    private["_held_json"] = (new.held, dict(cached[1])) if cached is not None and spliced else None
    private["_draft"], private["_edits"] = True, 0
    return new


def edited(record: QuotaRecord) -> bool:
    """Whether a draft was changed in place since :func:`drafted` made it."""
    return bool(_derived(record).get("_edits"))


def sealed(record: QuotaRecord) -> QuotaRecord:
    """``record`` no longer a draft: the next change copies it, as any record."""
    _derived(record)["_draft"] = False
    return record


def _in_place(record: QuotaRecord) -> bool:
    private = _derived(record)
    if not private.get("_draft"):
        return False
    private["_edits"] = private.get("_edits", 0) + 1
    return True


def reserved(record: QuotaRecord, entry: QuotaEntry) -> QuotaRecord:
    """``record`` with ``entry`` pending under its request id."""
    sums = _sums_of(record)  # before any change
    old = record.pending.get(entry.request_id)
    minus = [] if old is None else [pending_part(old)]
    if _in_place(record):
        new = record
        new.pending[entry.request_id] = entry
    else:
        new = record.model_copy(update={"pending": {**record.pending, entry.request_id: entry}})
    _derived(new)["_sums"] = moved(
        sums, (new.pending, new.held, new.volumes), [pending_part(entry)], minus
    )
    return new


def held(
    record: QuotaRecord,
    request_id: str,
    machines: Mapping[str, QuotaUse],
    volumes: Mapping[str, int] | None = None,
) -> QuotaRecord:
    """The pending ``request_id`` turned into what it made: one held machine per machine (its
    size as given: a create's, an update's new one), each volume at its size; none made: it is
    dropped."""
    sums = _sums_of(record)  # before any change
    cached = _derived(record).get("_held_json")
    spliceable = cached is not None and cached[0] is record.held
    own = _in_place(record)
    pending = record.pending if own else dict(record.pending)
    entry = pending.pop(request_id, None)
    klass = entry.priority_class if entry else ""
    minus = [] if entry is None else [pending_part(entry)]
    plus: list[Part] = []
    kept = record.held if own else dict(record.held)
    for machine_id, use in machines.items():
        size: Held = (use.cpus, use.memory_mb, klass)
        if machine_id in kept:
            minus.append(held_part(kept[machine_id]))
        kept[machine_id] = size
        plus.append(held_part(size))
    kept_volumes = record.volumes
    if volumes:
        kept_volumes = record.volumes if own else dict(record.volumes)
        for volume_id, size_gb in volumes.items():
            if volume_id in kept_volumes:
                minus.append(volume_part(kept_volumes[volume_id]))
            kept_volumes[volume_id] = size_gb
            plus.append(volume_part(size_gb))
    update = {"pending": pending, "held": kept, "volumes": kept_volumes}
    new = record if own else record.model_copy(update=update)
    _derived(new)["_sums"] = moved(sums, (new.pending, new.held, new.volumes), plus, minus)
    if cached is not None and spliceable:
        # What it held keeps its JSON; only the machines of this change are encoded (in place
        # in a draft's own dict of them).
        parts = cached[1] if own else dict(cached[1])
        for machine_id in machines:
            parts[machine_id] = _raw(kept[machine_id])
        _derived(new)["_held_json"] = (kept, parts)
    elif own:
        _derived(new)["_held_json"] = None  # its held machines changed in place
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
