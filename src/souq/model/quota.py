"""Quotas: how much an app (or an organization, over all its apps) may hold, and the ledger of
what it holds. Pure: no I/O (the ledger's store is :mod:`souq.broker.quotas`).

A scope's record (``QuotaRecord``) keeps its limits beside its ledger, so that one
compare-and-set on one key both checks and takes: every entry is a machine (or a batch's
machines) counted against the limits —

* **pending**: reserved by a broker for a create under way, keyed by the create's request id,
  with a ``deadline_ms``. Its create answered, it becomes held (or is dropped, refused).
* **held**: keyed by the machine's id, its size only (compact: the whole record is written at
  every change); a destroy drops it.

A pending entry whose deadline passed (its broker crashed between reserving and the claim's
answer) is *reconciled* (:func:`reconciled`) against the machines the cluster has: held if a
machine of that request id exists, dropped if none does. A held entry whose machine is destroyed
(a destroy this broker did not make: ``auto_destroy``, a worker's clean-up) is dropped the same
way; machines the cluster has that the ledger lacks (made before the quota was set) are added.
So the ledger never leaks for good, and never admits a create past a limit.

Per priority class: each entry (and held machine) carries its priority class (``""``: none),
so that limits per class (``classes: {name: QuotaLimits}``) can be checked against the entries
of that class only when classes exist; today every entry is of class ``""``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from souq.model.base import Input, Record

__all__ = [
    "BATCH_MARK",
    "DIMENSIONS",
    "ClusterMachine",
    "Excess",
    "Held",
    "QuotaEntry",
    "QuotaLimits",
    "QuotaRecord",
    "QuotaUse",
    "QuotaView",
    "Scope",
    "excess",
    "held",
    "reconciled",
    "released",
    "reserved",
    "use_of",
    "use_of_record",
]

Scope = Literal["app", "org"]
DIMENSIONS = ("cpus", "memory_mb", "machines")  # volumes' size: not yet (docs/quotas.md)
_UNITS = {"cpus": "cpus", "memory_mb": "MiB", "machines": "machines"}


class QuotaLimits(Input):
    """``PUT /v1/apps/{app}/quota`` (and ``/v1/orgs/{org}/quota``): the limits; a field left out
    (or null) has none. A PUT replaces the limits as a whole."""

    cpus: float | None = Field(default=None, ge=0, description="CPU cores over all machines")
    memory_mb: int | None = Field(default=None, ge=0, description="memory in MiB over all")
    machines: int | None = Field(default=None, ge=0, description="machines not destroyed")


class QuotaUse(Record):
    """What a scope holds (pending reservations included), per dimension."""

    cpus: float = 0.0
    memory_mb: int = 0
    machines: int = 0

    def plus(self, other: QuotaUse) -> QuotaUse:
        return QuotaUse(
            cpus=round(self.cpus + other.cpus, 3),
            memory_mb=self.memory_mb + other.memory_mb,
            machines=self.machines + other.machines,
        )


class QuotaEntry(Record):
    """One create's (or one machine's) share of a scope's use."""

    app: str
    request_id: str = Field(description="the create that made it (pending: its key)")
    use: QuotaUse
    deadline_ms: int | None = Field(default=None, description="pending until then; held: null")
    priority_class: str = Field(default="", description="'': no class (classes do not exist)")


Held = tuple[float, int, str]  # a machine's (cpus, memory_mb, priority class): compact on purpose


class QuotaRecord(Record):
    """One key of the quotas bucket: a scope's limits and ledger."""

    scope: Scope
    name: str
    limits: QuotaLimits
    pending: dict[str, QuotaEntry] = Field(
        default_factory=dict, description="creates under way, by request id"
    )
    held: dict[str, Held] = Field(
        default_factory=dict, description="machines counted: id → (cpus, memory_mb, class)"
    )


class QuotaView(Record):
    """``GET .../quota``: the limits, the use (pending included) and the pending part."""

    scope: Scope
    name: str
    limits: QuotaLimits
    use: QuotaUse
    pending: QuotaUse
    pending_creates: int


@dataclass(frozen=True)
class Excess:
    """The first limit a reservation would pass."""

    scope: Scope
    name: str
    dimension: str
    limit: float
    use: float
    asked: float

    def message(self) -> str:
        unit = _UNITS[self.dimension]
        return (
            f"{self.scope} {self.name} is over its {self.dimension} quota: limit "
            f"{_num(self.limit)} {unit}, in use {_num(self.use)}, this create asks "
            f"{_num(self.asked)} more"
        )


def _num(value: float) -> str:
    return f"{value:g}"


def use_of(entries: Iterable[QuotaEntry], held: Iterable[Held] = ()) -> QuotaUse:
    """The sum of ``entries`` and ``held`` machines."""
    cpus, memory_mb, machines = 0.0, 0, 0
    for entry in entries:
        use = entry.use
        cpus += use.cpus
        memory_mb += use.memory_mb
        machines += use.machines
    for machine_cpus, machine_memory, _ in held:
        cpus += machine_cpus
        memory_mb += machine_memory
        machines += 1
    return QuotaUse(cpus=round(cpus, 3), memory_mb=memory_mb, machines=machines)


def use_of_record(record: QuotaRecord) -> QuotaUse:
    """What ``record``'s scope holds, its creates under way included."""
    return use_of(record.pending.values(), record.held.values())


def excess(record: QuotaRecord, asked: QuotaUse) -> Excess | None:
    """The first limit of ``record`` that its use plus ``asked`` would pass; None: it fits."""
    use = use_of_record(record)
    for dimension in DIMENSIONS:
        limit = getattr(record.limits, dimension)
        want = getattr(asked, dimension)
        if limit is None or want <= 0:
            continue
        have = getattr(use, dimension)
        if have + want > limit + 1e-9:
            return Excess(record.scope, record.name, dimension, limit, have, want)
    return None


def reserved(record: QuotaRecord, entry: QuotaEntry) -> QuotaRecord:
    """``record`` with ``entry`` pending under its request id."""
    return record.model_copy(update={"pending": {**record.pending, entry.request_id: entry}})


def held(record: QuotaRecord, request_id: str, machines: Mapping[str, QuotaUse]) -> QuotaRecord:
    """The pending ``request_id`` turned into one held machine per machine made (none made: it
    is dropped)."""
    pending = dict(record.pending)
    entry = pending.pop(request_id, None)
    klass = entry.priority_class if entry else ""
    kept = dict(record.held)
    for machine_id, use in machines.items():
        kept[machine_id] = (use.cpus, use.memory_mb, klass)
    return record.model_copy(update={"pending": pending, "held": kept})


def released(record: QuotaRecord, keys: Iterable[str]) -> QuotaRecord:
    """``record`` without the machines (or creates) of ``keys``."""
    gone = set(keys)
    return record.model_copy(
        update={
            "pending": {k: e for k, e in record.pending.items() if k not in gone},
            "held": {k: h for k, h in record.held.items() if k not in gone},
        }
    )


@dataclass(frozen=True)
class ClusterMachine:
    """A machine of the cluster, as reconciliation needs it."""

    machine_id: str
    app: str
    request_id: str
    use: QuotaUse
    destroyed: bool


def reconciled(
    record: QuotaRecord,
    machines: Iterable[ClusterMachine],
    *,
    apps: set[str],
    now_ms: int,
) -> QuotaRecord:
    """``record``'s ledger against the cluster's machines of ``apps`` (the scope's apps):

    * a pending entry past its deadline is held for the machines of its request id that exist,
      else dropped (its broker crashed, or its create failed unanswered);
    * a held entry whose machine is destroyed is dropped;
    * a machine not destroyed that no entry counts is added (made before the quota was set, or
      by a broker that did not yet see it).

    Entries still pending within their deadline stay: their creates are under way."""
    by_id = {m.machine_id: m for m in machines if m.app in apps}
    by_request: dict[str, list[ClusterMachine]] = {}
    for machine in by_id.values():
        by_request.setdefault(_request_of(machine.request_id), []).append(machine)
    kept: dict[str, Held] = {}
    for machine_id, size in record.held.items():
        found = by_id.get(machine_id)
        if found is None:
            kept[machine_id] = size
        elif not found.destroyed:  # its size as it is (an update's)
            kept[machine_id] = (found.use.cpus, found.use.memory_mb, size[2])
    pending: dict[str, QuotaEntry] = {}
    for request_id, entry in record.pending.items():
        if entry.deadline_ms is None or entry.deadline_ms > now_ms:
            pending[request_id] = entry  # its create is under way
            continue
        # Its broker never settled it: the machines of its request that exist.
        for m in by_request.get(request_id, []):
            if not m.destroyed:
                kept[m.machine_id] = (m.use.cpus, m.use.memory_mb, entry.priority_class)
    for machine in by_id.values():
        if machine.destroyed or machine.machine_id in kept:
            continue
        if _request_of(machine.request_id) not in pending:  # else: the pending entry counts it
            kept[machine.machine_id] = (machine.use.cpus, machine.use.memory_mb, "")
    return record.model_copy(update={"pending": pending, "held": kept})


def _request_of(request_id: str) -> str:
    """A batch's machine's request id (``<batch request id>-<index>``) → the batch's; any other
    is itself. Batch request ids are marked by :data:`BATCH_MARK`."""
    head, mark, _ = request_id.rpartition(BATCH_MARK)
    return head if mark else request_id


BATCH_MARK = "~b"  # a batch's request id ends so; its machines' add "-<index>"
