"""Preemption in the fleet replay (:mod:`souq.sim.fleet`): which hosts' machines a create may
displace, and which host and victims it takes — the broker's rule, over columns.

:class:`Victims` knows every running instance of a class that can be displaced (``standard``
and ``spot``: a ``reserved`` one never is), per host, as the workers' admission would list it
(a :class:`~souq.market.preemption.Candidate`: its class, bid, reservation, GPUs, when it
started), and keeps per host and class what they hold in columns. :meth:`Victims.choose` takes
a create that fits nowhere:

1. the hosts that could take it if every machine it may displace were gone (the pipeline's
   filters over the book as it would then stand: its constraints, GPU model ...);
2. on each, the eviction the worker's admission would plan
   (:func:`souq.market.preemption.plan_eviction`, the broker's and the agents' chooser: the
   fewest, lowest-class, cheapest victims, at most ``max_victims``);
3. the host as the broker's auction ranks preempting offers: the smallest eviction
   (:meth:`~souq.market.preemption.Eviction.key`), then the pipeline's score of the host once
   its victims are gone, then the host's place.

Pure.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from souq.market.preemption import RANK, Candidate, Eviction, may_displace, plan_eviction
from souq.model.choices import PriorityClass
from souq.model.resources import Resources
from souq.placement import Pipeline, PlacementRequest
from souq.sim.arrays import Ints
from souq.sim.columns import OfferTable, evaluate

__all__ = ["Victim", "Victims"]

_DISPLACEABLE = (PriorityClass.SPOT, PriorityClass.STANDARD)


@dataclass(slots=True)
class Victim:
    """A running instance that can be displaced: as a candidate, and where the fleet keeps it
    (its group of placements and the position of its host in it)."""

    candidate: Candidate
    group: Any
    position: int
    started: float
    gpus: Ints | None = None  # the thousandths it took on each GPU of its host


@dataclass
class Victims:
    table: OfferTable
    hosts: list[Resources]
    by_host: dict[int, dict[str, Victim]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    # What the displaceable instances hold, per class rank (spot 0, standard 1) and host.
    _cpu: Ints = field(init=False)
    _mem: Ints = field(init=False)
    _disk: Ints = field(init=False)
    _gpu: Ints = field(init=False)
    _live: int = field(init=False)

    def __len__(self) -> int:
        """How many instances could be displaced now."""
        return self._live

    def __post_init__(self) -> None:
        self._live = 0
        n, width = len(self.table), self.table.gpu_free.shape[1]
        self._cpu = np.zeros((2, n), dtype=np.int64)
        self._mem = np.zeros((2, n), dtype=np.int64)
        self._disk = np.zeros((2, n), dtype=np.int64)
        self._gpu = np.zeros((2, n, width), dtype=np.int64)

    def add(
        self,
        row: int,
        *,
        app: str,
        klass: str,
        want: Resources,
        price: float | None,
        now: float,
        group: Any,
        position: int,
        gpus: Ints | None = None,
    ) -> str | None:
        """An instance started on host ``row``; its victim id (None: it cannot be displaced)."""
        if klass not in _DISPLACEABLE:
            return None
        victim_id = f"v{next(self._ids)}"
        gpu_ids = () if gpus is None else tuple(int(i) for i in np.flatnonzero(gpus))
        candidate = Candidate(
            machine_id=victim_id,
            app=app,
            priority_class=klass,
            resources=want,
            price=price,
            created_at=int(now * 1000),
            gpu_ids=gpu_ids,
        )
        self.by_host.setdefault(row, {})[victim_id] = Victim(candidate, group, position, now, gpus)
        self._count(row, candidate, gpus, +1)
        return victim_id

    def remove(self, row: int, victim_id: str) -> Victim | None:
        """The instance left (it ended, or was displaced)."""
        victim = self.by_host.get(row, {}).pop(victim_id, None)
        if victim is not None:
            self._count(row, victim.candidate, victim.gpus, -1)
        return victim

    def _count(self, row: int, c: Candidate, gpus: Ints | None, sign: int) -> None:
        rank = RANK[c.priority_class]
        self._live += sign
        self._cpu[rank, row] += sign * c.resources.millicpus
        self._mem[rank, row] += sign * c.resources.memory_mb
        self._disk[rank, row] += sign * c.resources.disk_mb
        if gpus is not None:
            self._gpu[rank, row] += sign * gpus

    def choose(
        self,
        pipeline: Pipeline,
        request: PlacementRequest,
        claimant: str,
        max_victims: int,
    ) -> tuple[int, Eviction] | None:
        """The host and the victims a create of class ``claimant`` that fits nowhere takes
        (see the module's docstring); None when no host would do."""
        ranks = [r for c, r in RANK.items() if may_displace(claimant, c) and r < 2]
        if not ranks or max_victims <= 0:
            return None
        t = self.table
        freed = self._as_if(t, ranks)
        ok = evaluate(pipeline, request, freed).ok
        plans: list[tuple[int, Eviction]] = []
        for row in np.flatnonzero(ok).tolist():
            victims = self.by_host.get(row)
            if not victims:
                continue
            plan = plan_eviction(
                request.resources,
                capacity=self.hosts[row],
                in_use=_in_use(t, row),
                gpu_free=t.gpu_free[row, : int(t.ngpu[row])].tolist(),
                candidates=[v.candidate for v in victims.values()],
                claimant=claimant,
                max_victims=max_victims,
            )
            if plan is not None and plan.victims:
                plans.append((row, plan))
        if not plans:
            return None
        best = min(p.key() for _, p in plans)
        tied = [(row, p) for row, p in plans if p.key() == best]
        if len(tied) == 1:
            return tied[0]
        rows = np.array([row for row, _ in tied], dtype=np.int64)
        after = t.after_claims(
            rows, np.zeros(len(rows), dtype=np.int64), Resources.zero(), rows * 0
        )
        for k, (_, plan) in enumerate(tied):
            after.cpu_used[k] -= plan.freed.millicpus
            after.mem_used[k] -= plan.freed.memory_mb
            after.disk_used[k] -= plan.freed.disk_mb
            if plan.gpu_free:
                after.gpu_free[k, : len(plan.gpu_free)] = plan.gpu_free
        scores = evaluate(pipeline, request, after).score
        k = int(np.lexsort((np.arange(len(tied)), -scores))[0])
        return tied[k]

    def _as_if(self, t: OfferTable, ranks: list[int]) -> OfferTable:
        """The book as it would stand with every instance of those class ranks gone."""
        rows = np.arange(len(t), dtype=np.int64)
        out = _copy(t, rows)
        out.cpu_used = out.cpu_used - self._cpu[ranks].sum(axis=0)
        out.mem_used = out.mem_used - self._mem[ranks].sum(axis=0)
        out.disk_used = out.disk_used - self._disk[ranks].sum(axis=0)
        out.gpu_free = out.gpu_free + self._gpu[ranks].sum(axis=0)
        return out


def _copy(t: OfferTable, rows: Ints) -> OfferTable:
    """Rows ``rows`` of the book, as a table of their own (its columns copies)."""
    none = np.zeros(len(rows), dtype=np.int64)
    return t.after_claims(rows, none, Resources.zero(), none)


def _in_use(t: OfferTable, row: int) -> Resources:
    return Resources(
        cpus=int(t.cpu_used[row]) / 1000,
        memory_mb=int(t.mem_used[row]),
        disk_mb=int(t.disk_used[row]),
    )
