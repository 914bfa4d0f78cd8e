"""Preemption: which machines a new one may displace, and which of them it does. Pure.

Three priority classes (:class:`~souq.model.choices.PriorityClass`), as a Borg or Nomad operator
expects of priority bands: a machine displaces only machines of a *strictly lower* class —
``reserved`` displaces ``standard`` and ``spot``, ``standard`` displaces ``spot``, ``spot``
displaces nobody — and a ``reserved`` machine is never displaced.

A worker that lacks room for a new machine looks at its *candidates* (the machines of a lower
class that hold a reservation and are not in the middle of an operation) and plans an
:class:`Eviction` (:func:`plan_eviction`): the fewest, cheapest victims whose reservations,
given back, make the new machine fit, at most ``max_victims``. Which victims come first:

1. the lowest class (no ``standard`` machine goes while ``spot`` ones would do);
2. the fewest machines;
3. the cheapest bids (``max_price``; a machine without one bids without limit, so it goes last
   within its class);
4. stopped before running ones (nothing is interrupted), then the newest (it lost the least
   work), then by id (deterministic).

Two greedy plans are made — victims in that order, and within each class the largest first — and
each is pruned (a victim whose room is not needed once the others are gone is spared, the
dearest first); the better by the order above wins. The result is never more than the machine
needs: removing any one victim would leave it without room.

A worker's candidates include the batch jobs it runs (``job:NAME``, of the job's class and bid):
a displaced run is stopped and its job goes back to the queue.

The same function serves the worker's offer (what it would displace) and its claim (what it does
displace, judged again on its ledger at that moment, so brokers racing for one worker each
displace only what their own machine needs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from souq.model.choices import PriorityClass
from souq.model.protocol import OfferedEviction
from souq.model.resources import Resources
from souq.placement import gpus
from souq.placement.stages import shortfall

__all__ = [
    "DEFAULT_MAX_VICTIMS",
    "JOB_VICTIM",
    "RANK",
    "Candidate",
    "Eviction",
    "JobRuns",
    "may_displace",
    "may_preempt",
    "plan_eviction",
]

DEFAULT_MAX_VICTIMS = 8  # machines one create may displace (the broker's `preempt_max_victims`)
JOB_VICTIM = "job:"  # a batch job's run as a victim: ``job:NAME`` (it goes back to the queue)

RANK: dict[str, int] = {
    PriorityClass.SPOT: 0,
    PriorityClass.STANDARD: 1,
    PriorityClass.RESERVED: 2,
}


class JobRuns(Protocol):
    """A worker's batch job runs, as preemption sees them (``souq.agent.jobs.runner.JobRunner``)."""

    def preemptible(self, claimant: str) -> list[Candidate]:
        """The runs a machine of class ``claimant`` could displace (``JOB_VICTIM + name``)."""

    def preempt(self, name: str, by: str) -> None:
        """Displace run ``name`` for machine ``by``: its room given back at once."""


def may_displace(claimant: str, victim: str) -> bool:
    """Whether a machine of class ``claimant`` may displace one of class ``victim``."""
    return victim != PriorityClass.RESERVED and RANK[claimant] > RANK[victim]


def may_preempt(claimant: str) -> bool:
    """Whether a machine of class ``claimant`` may displace anything at all."""
    return RANK[claimant] > RANK[PriorityClass.SPOT]


@dataclass(frozen=True)
class Candidate:
    """A machine that could be displaced: what it reserves and what it bids."""

    machine_id: str
    app: str
    priority_class: str
    resources: Resources
    price: float | None = None  # its max_price (None: no limit)
    running: bool = True
    created_at: int = 0
    gpu_ids: tuple[int, ...] = ()

    @property
    def bid(self) -> float:
        return math.inf if self.price is None else self.price


@dataclass(frozen=True)
class Eviction:
    """The victims a new machine displaces (none: it fits as it is), and what they free."""

    victims: tuple[Candidate, ...] = ()
    freed: Resources = field(default_factory=Resources.zero)
    gpu_free: tuple[int, ...] = ()  # each GPU's free thousandths once they are gone

    @property
    def top_class(self) -> int:
        """The rank of the highest class displaced (-1: none)."""
        return max((RANK[v.priority_class] for v in self.victims), default=-1)

    @property
    def cost(self) -> tuple[int, float]:
        """What the victims bid: how many bid without limit, then the sum of the others."""
        unbounded = sum(1 for v in self.victims if v.price is None)
        return unbounded, sum(v.price for v in self.victims if v.price is not None)

    def key(self) -> tuple[int, int, int, float, int]:
        """Smaller is better: class, count, cost, then how many run."""
        unbounded, priced = self.cost
        running = sum(1 for v in self.victims if v.running)
        return self.top_class, len(self.victims), unbounded, priced, running

    def offered(self) -> OfferedEviction:
        """This eviction as a worker's offer tells it to the broker."""
        unbounded, priced = self.cost
        return OfferedEviction(
            victims=len(self.victims),
            freed=self.freed,
            gpu_free=list(self.gpu_free),
            top_class=self.top_class,
            unbounded=unbounded,
            priced=priced,
            running=sum(1 for v in self.victims if v.running),
        )


def _order(c: Candidate) -> tuple[int, float, bool, int, str]:
    return RANK[c.priority_class], c.bid, c.running, -c.created_at, c.machine_id


def _largest_first(c: Candidate) -> tuple[int, int, int, float, bool, int, str]:
    r = c.resources
    return RANK[c.priority_class], -r.millicpus, -r.memory_mb, c.bid, c.running, 0, c.machine_id


def plan_eviction(
    want: Resources,
    *,
    capacity: Resources,
    in_use: Resources,
    gpu_free: Sequence[int],
    candidates: Iterable[Candidate],
    claimant: str,
    max_victims: int,
) -> Eviction | None:
    """The victims that make room for a machine of ``want`` and class ``claimant`` on a worker
    of ``capacity`` with ``in_use`` promised (``gpu_free``: each GPU's free thousandths), chosen
    among ``candidates``; an empty :class:`Eviction` when it fits as it is; None when no
    allowed set of at most ``max_victims`` makes room."""
    free = tuple(gpu_free)
    if shortfall(want, capacity, in_use, free) is None:
        return Eviction(gpu_free=free)
    if max_victims <= 0 or not may_preempt(claimant):
        return None
    allowed = [c for c in candidates if may_displace(claimant, c.priority_class)]
    plans = [
        plan
        for key in (_order, _largest_first)
        if (plan := _greedy(want, capacity, in_use, free, sorted(allowed, key=key))) is not None
    ]
    plans = [p for p in plans if len(p.victims) <= max_victims]
    return min(plans, key=Eviction.key) if plans else None


def _greedy(
    want: Resources,
    capacity: Resources,
    in_use: Resources,
    gpu_free: tuple[int, ...],
    ordered: list[Candidate],
) -> Eviction | None:
    """Take victims in ``ordered`` until ``want`` fits; then spare each one not needed (the
    last taken first: the dearest, or the largest)."""
    chosen: list[Candidate] = []
    for candidate in ordered:
        chosen.append(candidate)
        if _fits(want, capacity, in_use, gpu_free, chosen):
            break
    else:
        return None
    for candidate in reversed(chosen[:-1]):
        rest = [c for c in chosen if c is not candidate]
        if _fits(want, capacity, in_use, gpu_free, rest):
            chosen = rest
    return _eviction(in_use, gpu_free, chosen)


def _freed(
    in_use: Resources, gpu_free: tuple[int, ...], victims: Sequence[Candidate]
) -> tuple[Resources, tuple[int, ...]]:
    used, free = in_use, gpu_free
    for v in victims:
        used = used.minus(v.resources)
        free = gpus.give_back(v.resources, free, v.gpu_ids)
    return used, free


def _fits(
    want: Resources,
    capacity: Resources,
    in_use: Resources,
    gpu_free: tuple[int, ...],
    victims: Sequence[Candidate],
) -> bool:
    used, free = _freed(in_use, gpu_free, victims)
    return shortfall(want, capacity, used, free) is None


def _eviction(in_use: Resources, gpu_free: tuple[int, ...], victims: list[Candidate]) -> Eviction:
    used, free = _freed(in_use, gpu_free, victims)
    return Eviction(victims=tuple(victims), freed=in_use.minus(used), gpu_free=free)
