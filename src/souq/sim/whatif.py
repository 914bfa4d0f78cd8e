"""What-if on the live cluster: where a planned batch of machines would go, and why, before any
of it is made.

The workers as the broker lists them (``GET /v1/workers``: capacity, what is allocated, each
GPU's free thousandths, labels, state) become a :class:`~souq.sim.cluster.VirtualCluster`:
each worker's admission holds what is allocated on it now, a cordoned or draining worker stays
so, a down worker is left out (no broker places on it). The app's machines are told to the
broker's book, so that anti-affinity and ``distinct_workers_for`` see them.

Then each planned machine in turn gets a dry run (the placement record ``POST
/v1/apps/{app}/machines?dry_run=true`` gives, from the same book, auction and pipeline) and,
if it fits, is claimed on the worker the dry run named: the next machine sees it. So the tenth
machine of a batch is placed beside the first nine, where ten dry runs would each see an empty
cluster. A machine that fits nowhere is reported with its record and the reason its record
counts most.

Pure: the caller fetches the workers and machines and prints the outcome.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from souq.clock import VirtualClock
from souq.errors import UnknownRegion
from souq.market import Purpose, Rules
from souq.model.constraint import Constraint, ConstraintOperator
from souq.model.placement import Placement
from souq.model.policy import PlacementDefaults, PlacementPolicy
from souq.model.resources import GPU_MILLI, Resources
from souq.model.worker import WorkerInfo, WorkerState
from souq.placement import Pipeline, build_pipeline
from souq.placement.gpus import free_of
from souq.sim.cluster import Placed, SimBroker, SimWorker, VirtualCluster
from souq.sim.departures import failure_reason

__all__ = ["Existing", "Planned", "Snapshot", "Verdict", "WhatIf", "batch", "snapshot", "what_if"]


@dataclass(frozen=True)
class Planned:
    """One machine to place: its app, region and size, where it may run, and (``apart``) kept
    off the workers its group's other machines in the region hold while others have room, as
    a deploy spreads a group with services."""

    app: str
    region: str
    resources: Resources
    constraints: tuple[Constraint, ...] = ()
    distinct_workers_for: str | None = None
    group: str | None = None
    apart: bool = False

    def describe(self) -> str:
        r = self.resources
        size = f"{r.cpus:g} cpus / {r.memory_mb} MiB"
        if r.gpus:
            size += f" / {r.gpus} gpus"
        elif r.gpu_milli:
            size += f" / {r.gpu_milli}/{GPU_MILLI} gpu"
        if r.gpu_model:
            size += f" {r.gpu_model}"
        group = f" {self.group}" if self.group else ""
        return f"{self.app}{group}, {size} in {self.region}"


def batch(
    app: str,
    region: str,
    resources: Resources,
    count: int,
    *,
    constraints: tuple[Constraint, ...] = (),
    distinct_workers_for: str | None = None,
) -> list[Planned]:
    """``count`` machines of one size (``souq machine run``'s, ``count`` times)."""
    one = Planned(app, region, resources, constraints, distinct_workers_for)
    return [one] * count


@dataclass(frozen=True)
class Existing:
    """A machine of the cluster, as its app's listing shows it."""

    machine_id: str
    worker_id: str
    app: str
    region: str = ""
    group: str | None = None


@dataclass
class Snapshot:
    """The cluster as the broker saw it, on virtual time: one broker, the workers taken in."""

    cluster: VirtualCluster
    broker: SimBroker
    skipped: list[str] = field(default_factory=list)  # down workers, left out
    existing: list[Existing] = field(default_factory=list)

    @property
    def regions(self) -> list[str]:
        return sorted({w.region for w in self.cluster.workers.values()})


def snapshot(
    workers: Sequence[WorkerInfo],
    *,
    machines: Iterable[Existing] = (),
    policy: PlacementPolicy | None = None,
    pipeline: Pipeline | None = None,
    rules: Rules | None = None,
) -> Snapshot:
    """``workers`` (``GET /v1/workers``) in a virtual cluster, each with its allocation
    reserved; ``machines``: the app's, told to the book."""
    chosen = pipeline or build_pipeline(policy, PlacementDefaults())
    cluster = VirtualCluster(clock=VirtualClock(), pipeline=chosen, rules=rules)
    skipped: list[str] = []
    for info in workers:
        if info.state is WorkerState.DOWN:
            skipped.append(info.id)
            continue
        worker = cluster.add_worker(
            info.region, info.capacity, labels=dict(info.labels), worker_id=info.id
        )
        worker.fingerprint, worker.load = info.fingerprint, info.load
        _take_in(worker, info)
        if info.state is not WorkerState.UP:
            draining = info.state is WorkerState.DRAINING
            cluster.set_flags(info.id, cordoned=True, draining=draining)
    broker = cluster.add_broker()  # it hears every worker as it now stands
    existing = [m for m in machines if m.worker_id in cluster.workers]
    for m in existing:
        broker.book.placed(m.machine_id, m.worker_id, m.app)
    return Snapshot(cluster, broker, skipped, existing)


def _take_in(worker: SimWorker, info: WorkerInfo) -> None:
    """The worker's admission holds what it has allocated, GPU by GPU as it said (a GPU wholly
    in use as a whole GPU's machine, one partly used as a share's: what its machines are is not
    listed)."""
    admission = worker.admission
    admission.reserved = info.allocated
    for index, free in enumerate(free_of(info.capacity, info.allocated, info.gpu_free)):
        if free < GPU_MILLI:
            used = GPU_MILLI - free
            whole = Resources(cpus=0, memory_mb=0, gpus=1)
            share = Resources(cpus=0, memory_mb=0, gpu_milli=used)
            admission.adopt_gpus(whole if used == GPU_MILLI else share, (index,))


@dataclass(frozen=True)
class Verdict:
    """Where planned machine ``index`` (1-based) would go (``worker``), with the record its
    dry run gives; or why it would not fit (``reason``, ``error``)."""

    index: int
    planned: Planned
    worker: str | None
    placement: Placement
    reason: str | None = None
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        p = self.planned
        return {
            "index": self.index,
            "app": p.app,
            "group": p.group,
            "region": p.region,
            "resources": p.resources.model_dump(mode="json"),
            "worker": self.worker,
            "reason": self.reason,
            "error": self.error,
            "placement": self.placement.model_dump(mode="json"),
        }


@dataclass(frozen=True)
class WhatIf:
    """A what-if's answer: each planned machine's verdict, in order."""

    verdicts: list[Verdict]
    workers: int
    skipped: list[str]

    @property
    def placed(self) -> int:
        return sum(1 for v in self.verdicts if v.worker is not None)

    @property
    def unplaced(self) -> int:
        return len(self.verdicts) - self.placed

    def reasons(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for v in self.verdicts:
            if v.reason is not None:
                counts[v.reason] = counts.get(v.reason, 0) + 1
        return dict(sorted(counts.items()))

    def as_json(self) -> dict[str, Any]:
        return {
            "snapshot": {"workers": self.workers, "skipped": self.skipped},
            "placed": self.placed,
            "unplaced": self.unplaced,
            "reasons": self.reasons(),
            "machines": [v.as_json() for v in self.verdicts],
        }


def what_if(snap: Snapshot, planned: Sequence[Planned]) -> WhatIf:
    """Each planned machine in turn: its dry run, then, if it fits, its claim on the worker the
    dry run named (so the next one sees it). The snapshot is changed: run it once."""
    known = snap.regions
    unknown = sorted({p.region for p in planned} - set(known))
    if unknown:
        raise UnknownRegion(
            f"region {unknown[0]!r} is unknown; known regions: {', '.join(known) or 'none'}",
            hint="pick one of the known regions (see `souq workers`)",
        )
    taken: dict[tuple[str, str | None, str], set[str]] = {}
    for m in snap.existing:
        taken.setdefault((m.app, m.group, m.region), set()).add(m.worker_id)
    verdicts: list[Verdict] = []
    for index, plan in enumerate(planned, start=1):
        key = (plan.app, plan.group, plan.region)
        away = sorted(taken.get(key, ())) if plan.apart else []
        verdict = None
        if away:  # off the group's workers first; sharing one if no other has room
            verdict = _place(snap, index, plan, _not_on(away))
            verdict = verdict if verdict.worker is not None else None
        verdict = verdict or _place(snap, index, plan, ())
        if verdict.worker is not None:
            taken.setdefault(key, set()).add(verdict.worker)
        verdicts.append(verdict)
    return WhatIf(verdicts, len(snap.cluster.workers), list(snap.skipped))


def _not_on(workers: list[str]) -> tuple[Constraint, ...]:
    return (Constraint(attribute="worker.id", operator=ConstraintOperator.NOT_IN, value=workers),)


def _place(snap: Snapshot, index: int, plan: Planned, extra: tuple[Constraint, ...]) -> Verdict:
    cluster, broker = snap.cluster, snap.broker
    create: dict[str, Any] = {
        "app": plan.app,
        "region": plan.region,
        "resources": plan.resources,
        "constraints": plan.constraints + extra,
        "distinct_workers_for": plan.distinct_workers_for,
        "request_id": f"what-if-{index:05d}{'-apart' if extra else ''}",
    }
    dry = cluster.place(broker, purpose=Purpose.EXPLAIN, **create)
    record: Placement = dry.record
    if dry.error is not None or record.winner is None:
        return _refused(index, plan, dry)
    made = cluster.place(broker, **create)  # the same request id: the same draw and ranking
    if made.error is not None or not made.workers:
        return _refused(index, plan, made, record)
    worker_id = made.workers[0]
    broker.book.placed(made.machines[0], worker_id, plan.app)
    return Verdict(index, plan, worker_id, record)


def _refused(index: int, plan: Planned, placed: Placed, record: Placement | None = None) -> Verdict:
    message = placed.error.message if placed.error is not None else "no worker has room"
    return Verdict(
        index,
        plan,
        None,
        record or placed.record,
        reason=failure_reason(placed),
        error=message,
    )
