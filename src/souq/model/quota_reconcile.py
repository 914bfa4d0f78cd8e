"""Reconciling a quota's ledger (:mod:`souq.model.quota`) with the machines and volumes the
cluster has. Pure: the broker reads the cluster (:mod:`souq.broker.quotas`) and calls
:func:`reconciled`.

A pending entry whose deadline passed (its broker crashed between reserving and the answer) is
held for the machines of its request id that exist and dropped otherwise. A held machine that is
destroyed (a destroy this broker did not make: ``auto_destroy``, a worker's clean-up) is dropped;
one the ledger lacks (made before the quota was set) is added; each takes its size and class as
they are (the caller's ``ClusterMachine.use``: a machine preemption displaced holds no room,
``souq.broker.quotas.use_of_machine``). Volumes: the live volumes are the truth where their
worker answered — a held volume its worker no longer lists is dropped, a live volume the
ledger lacks is added. So the ledger never leaks for good, and never admits a change past a
limit: nothing still within its deadline is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from souq.model.quota import BATCH_MARK, Held, QuotaEntry, QuotaRecord, QuotaUse

__all__ = ["ClusterMachine", "ClusterVolumes", "reconciled"]


@dataclass(frozen=True)
class ClusterMachine:
    """A machine of the cluster, as reconciliation needs it."""

    machine_id: str
    app: str
    request_id: str
    use: QuotaUse
    destroyed: bool
    priority_class: str = ""


@dataclass(frozen=True)
class ClusterVolumes:
    """The scope's live volumes (id → size_gb), and whether the listing is complete for a
    volume id (its worker answered): a held volume is dropped only then."""

    sizes: Mapping[str, int]
    listed: Callable[[str], bool]


def reconciled(
    record: QuotaRecord,
    machines: Iterable[ClusterMachine],
    *,
    apps: set[str],
    now_ms: int,
    volumes: ClusterVolumes | None = None,
) -> QuotaRecord:
    """``record``'s ledger against the cluster's machines (and volumes) of ``apps`` (the
    scope's apps):

    * a pending entry past its deadline is held for the machines of its request id that exist,
      else dropped (its broker crashed, or its change failed unanswered);
    * a held machine that is destroyed is dropped; one alive takes its size and class as they
      are (an update's);
    * a machine not destroyed that no entry counts is added (made before the quota was set, or
      by a broker that did not yet see it);
    * with ``volumes``: held volumes take their live size, those gone are dropped, live ones
      the ledger lacks are added.

    Entries still pending within their deadline stay: their changes are under way."""
    by_id = {m.machine_id: m for m in machines if m.app in apps}
    by_request: dict[str, list[ClusterMachine]] = {}
    for machine in by_id.values():
        by_request.setdefault(_request_of(machine.request_id), []).append(machine)
    kept: dict[str, Held] = {}
    for machine_id, size in record.held.items():
        found = by_id.get(machine_id)
        if found is None:
            kept[machine_id] = size
        elif not found.destroyed:  # its size and class as they are (an update's)
            kept[machine_id] = (found.use.cpus, found.use.memory_mb, found.priority_class)
    pending: dict[str, QuotaEntry] = {}
    for request_id, entry in record.pending.items():
        if entry.deadline_ms is None or entry.deadline_ms > now_ms:
            pending[request_id] = entry  # its change is under way
            continue
        # Its broker never settled it: the machines of its request that exist.
        for m in by_request.get(request_id, []):
            if not m.destroyed:
                kept[m.machine_id] = (m.use.cpus, m.use.memory_mb, m.priority_class)
    for machine in by_id.values():
        if machine.destroyed or machine.machine_id in kept:
            continue
        if _request_of(machine.request_id) not in pending:  # else: the pending entry counts it
            kept[machine.machine_id] = (
                machine.use.cpus,
                machine.use.memory_mb,
                machine.priority_class,
            )
    update: dict[str, object] = {"pending": pending, "held": kept}
    if volumes is not None:
        update["volumes"] = _volumes(record.volumes, volumes)
    return record.model_copy(update=update)


def _volumes(held: Mapping[str, int], cluster: ClusterVolumes) -> dict[str, int]:
    kept = {
        volume_id: cluster.sizes.get(volume_id, size)
        for volume_id, size in held.items()
        if volume_id in cluster.sizes or not cluster.listed(volume_id)
    }
    for volume_id, size in cluster.sizes.items():
        kept.setdefault(volume_id, size)  # a volume never counted (or its create's, pending)
    return kept


def _request_of(request_id: str) -> str:
    """A batch's machine's request id (``<batch request id>-<index>``) → the batch's; any other
    is itself. Batch request ids are marked by :data:`BATCH_MARK`."""
    head, mark, _ = request_id.rpartition(BATCH_MARK)
    return head if mark else request_id
