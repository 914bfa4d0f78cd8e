"""The agent's side of preemption: which of its machines a new one could displace, and their
eviction once admission chose them (:mod:`souq.market.preemption` decides, purely).

A victim gets an event ``preempted`` (``source: agent``) naming the machine that took its room,
and gives its reservation back in the same step; a running one is stopped as a user's stop
would be (its stop signal, SIGKILL after its ``kill_timeout``), so it leaves the proxies'
rotation at once and ends ``stopped``; a stopped one (holding room) just gives the room back. A
later start takes room again, judged as a new machine is (as for a failed one).

What each lower class could free (:func:`room`) goes out with every heartbeat and usage
message, so that a broker's book can send a create that fits nowhere straight to a claim that
preempts (no round of offers asking whom each worker would displace).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING

from souq.agent.machines.displacing import DISPLACEABLE, RUNNING, displace
from souq.agent.state.records import MachineRow
from souq.market.preemption import JOB_VICTIM, Candidate, Eviction, JobRuns, may_displace
from souq.model.choices import PriorityClass
from souq.model.machine import MachineState
from souq.model.placement import PreemptedMachine
from souq.model.resources import Resources
from souq.model.worker import PreemptibleRoom

if TYPE_CHECKING:
    from souq.agent.machines.executor import Executor

__all__ = ["Room", "candidates", "evict", "told"]

S = MachineState


def _displaceable(ex: Executor, row: MachineRow, claimant: str) -> bool:
    """Whether ``row`` may be displaced by a machine of class ``claimant``: of a lower class,
    holding a reservation, settled (no operation under way)."""
    return (
        row.state in DISPLACEABLE
        and may_displace(claimant, row.config.priority_class)
        and row.id not in ex.unreserved
        and ex.current_op(row.id) is None
    )


def candidates(ex: Executor, claimant: str) -> list[Candidate]:
    """The machines here that a machine of class ``claimant`` could displace
    (:func:`_displaceable`), and the batch jobs running here of a lower class
    (``ex.job_runs``)."""
    jobs: JobRuns | None = ex.job_runs
    found = [] if jobs is None else jobs.preemptible(claimant)
    for row in ex.rows():
        if not _displaceable(ex, row, claimant):
            continue
        found.append(
            Candidate(
                machine_id=row.id,
                app=row.app,
                priority_class=row.config.priority_class,
                resources=row.resources,
                price=row.config.max_price,
                running=row.state in RUNNING,
                created_at=row.created_at,
                gpu_ids=tuple(row.gpu_ids),
            )
        )
    return found


class _Sum:
    """What one class's candidates reserve, how many they are and their lowest bid."""

    def __init__(self) -> None:
        self.millicpus = self.memory_mb = self.disk_mb = self.gpus = self.gpu_milli = 0
        self.machines = 0
        self.cheapest: float | None = None

    def add(self, resources: Resources, price: float | None) -> None:
        self.millicpus += resources.millicpus
        self.memory_mb += resources.memory_mb
        self.disk_mb += resources.disk_mb
        self.gpus += resources.gpus
        self.gpu_milli += resources.gpu_milli
        self.machines += 1
        if price is not None and (self.cheapest is None or price < self.cheapest):
            self.cheapest = price

    def room(self, klass: str) -> PreemptibleRoom:
        reserved = Resources(
            cpus=self.millicpus / 1000,
            memory_mb=self.memory_mb,
            disk_mb=self.disk_mb,
            gpus=self.gpus,
            gpu_milli=self.gpu_milli,
        )
        return PreemptibleRoom(
            priority_class=klass, resources=reserved, machines=self.machines, cheapest=self.cheapest
        )


class Room:
    """What the machines (and batch job runs) of each class below ``reserved`` could free here,
    by the same rule as :func:`candidates`, lowest class first, classes with none left out
    (:meth:`now`). Heartbeats and usage messages carry it, so the machines are summed again only
    after something changed (the ledger's version, a machine's step or its operation's
    progress); the job runs, few, are read each time."""

    def __init__(self, ex: Executor) -> None:
        self._ex = ex
        self._seen: tuple[int, int] | None = None
        self._machines: dict[str, _Sum] = {}

    def now(self) -> list[PreemptibleRoom]:
        ex = self._ex
        key = (ex.admission.version, ex.changes)
        if key != self._seen:
            self._seen, self._machines = key, {}
            for row in ex.rows():
                if _displaceable(ex, row, PriorityClass.RESERVED):
                    total = self._machines.setdefault(row.config.priority_class, _Sum())
                    total.add(row.resources, row.config.max_price)
        jobs: JobRuns | None = ex.job_runs
        runs = [] if jobs is None else jobs.preemptible(PriorityClass.RESERVED)
        out = []
        for klass in (PriorityClass.SPOT, PriorityClass.STANDARD):
            summed = self._machines.get(klass)
            these = [r for r in runs if r.priority_class == klass]
            if these:
                summed = copy.copy(summed) if summed is not None else _Sum()
                for run in these:
                    summed.add(run.resources, run.price)
            if summed is not None:
                out.append(summed.room(klass))
        return out


def told(eviction: Eviction, *, by: str, app: str, claimant: str) -> list[PreemptedMachine]:
    """What the placement record of machine ``by`` of ``app`` (class ``claimant``) says of the
    victims it displaces, and why."""
    return [
        PreemptedMachine(
            machine_id=victim.machine_id,
            app=victim.app,
            priority_class=victim.priority_class,
            max_price=victim.price,
            cpus=victim.resources.cpus,
            memory_mb=victim.resources.memory_mb,
            running=victim.running,
            reason=(
                f"priority_class {claimant} displaces {victim.priority_class}: no worker had "
                f"room for machine {by} of app {app}"
            ),
        )
        for victim in eviction.victims
    ]


def evict(ex: Executor, victims: Sequence[PreemptedMachine], *, by: str, app: str) -> None:
    """Displace ``victims`` (:func:`told`) for machine ``by`` of ``app``, once its record is
    written (a claim that fails before that displaces nobody): each gives its reservation
    back now and, if it runs, is stopped. Their steps commit unsynced, after the new
    machine's; the claim syncs the store before it answers (a sync makes every write before
    it durable)."""
    for victim in victims:
        if victim.machine_id.startswith(JOB_VICTIM):
            jobs: JobRuns | None = ex.job_runs
            assert jobs is not None  # only its runner proposed it
            jobs.preempt(victim.machine_id.removeprefix(JOB_VICTIM), by)
        else:
            row = ex.row_by_id(victim.machine_id)
            displace(ex, row, f"preempted by machine {by} of app {app}: {victim.reason}")
