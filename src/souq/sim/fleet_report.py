"""What a fleet replay measures (:mod:`souq.sim.fleet`), weighted by time, and how a run is
set to place and measure (:class:`Settings`).

:class:`Measures` keeps running integrals as the run goes: between two events the fleet does
not change, so each quantity times the interval is added when the next event comes. From them,
:class:`FleetReport`:

* ``utilisation``: per resource (``cpu``, ``memory``, and ``gpu`` only where the hosts have
  GPUs), what was allocated over what there is, averaged over time, %;
* ``hot``: per resource, the share of host-time during which a host was above the threshold, %;
* ``hosts``: each host's utilisation averaged over time, as the p95 (nearest rank) and the max
  over hosts, %;
* ``waits``: from an instance's arrival to its start, seconds, over the instances placed
  (p50, p95, max, mean);
* ``jobs``: each job's completion time (its first arrival to its last instance's end, seconds)
  and its slowdown (that time over the time it would take on an infinite cluster, where nothing
  waits), over the jobs whose every instance ran and left;
* ``fragmentation``: per resource, the share of the free capacity that sat on hosts with no
  room for one instance of the task being placed (free but unusable by it), %, the mean over
  the placements tried (CPU, memory and disk requests);
* ``timeline``: samples every step from the first arrival to the last departure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from souq.market.preemption import DEFAULT_MAX_VICTIMS
from souq.model.resources import GPU_MILLI
from souq.sim.arrays import Floats
from souq.sim.classes import ClassesTold
from souq.sim.columns import OfferTable
from souq.sim.traces import Task

__all__ = ["FleetReport", "Measures", "Sample", "Settings", "weighted_percentile"]


@dataclass(frozen=True, slots=True)
class Settings:
    """How one run places and measures."""

    batch: bool = True  # a task's instances as one batch create (all or none)
    queue: bool = False  # FIFO: a task that does not fit waits instead of failing
    # With the queue: the batch-jobs queue's rule instead of strict FIFO: the oldest of the
    # tasks that fit goes first; one that does not fit holds up none behind it.
    backfill: bool = False
    hot: float = 0.9  # a host above this share of a resource is hot
    sample_every_s: float | None = None  # the timeline's step (None: 200 over the trace)
    seed: int = 0  # ties in the seeded order
    # A single create that fits nowhere may displace at most this many instances of a lower
    # priority class (souq.sim.fleet_preemption; the broker's preempt_max_victims; 0: none).
    preempt: int = DEFAULT_MAX_VICTIMS
    # The span the report's window_utilisation is over (None: the trace's own).
    window: tuple[float, float] | None = None


def weighted_percentile(values: Floats, weights: Floats, p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``values`` each counted ``weights`` times."""
    if len(values) == 0 or weights.sum() <= 0:
        return 0.0
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    k = max(1.0, math.ceil(p / 100 * cumulative[-1]))
    return float(values[order][np.searchsorted(cumulative, k)])


def _nearest(values: Floats, p: float) -> float:
    return weighted_percentile(values, np.ones(len(values)), p)


@dataclass(frozen=True, slots=True)
class Sample:
    """The fleet at time ``t``: instances running, tasks waiting and the longest wait so far of
    the one at the head, allocation %, hosts' p95/max %."""

    t: float
    running: int
    queued: int  # tasks waiting
    head_wait: float  # how long the task at the queue's head has waited, seconds
    cpu: float
    memory: float
    gpu: float | None
    host_cpu_p95: float
    host_cpu_max: float
    host_memory_p95: float
    host_memory_max: float


@dataclass(frozen=True)
class FleetReport(ClassesTold):
    policy: str
    batch: bool
    queue: bool
    backfill: bool
    hosts: int
    tasks: int
    instances: int
    placed: int
    failed: int
    failed_by_reason: dict[str, int]
    span_s: tuple[float, float]
    hot_threshold: float
    utilisation: dict[str, float]
    hot: dict[str, float]
    host_utilisation: dict[str, float]
    waits: dict[str, float]
    jobs: dict[str, float]
    fragmentation: dict[str, float]
    timeline: list[Sample]
    # Per priority class (souq.sim.classes.ClassTally.as_json); the most instances one create
    # may displace.
    classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    preempt: int = 0
    # Allocated over capacity, % per resource, averaged over a fixed span (the trace's own
    # unless the replay was given one): runs of one trace compare over it.
    window_s: tuple[float, float] = (0.0, 0.0)
    window_utilisation: dict[str, float] = field(default_factory=dict)

    def as_json(self, *, timeline: bool = True) -> dict[str, Any]:
        body = {k: v for k, v in asdict(self).items() if k != "timeline"}
        body["failed_by_reason"] = dict(sorted(self.failed_by_reason.items()))
        body["preempt_max_victims"] = body.pop("preempt")
        body["preemptions"] = self.preemptions
        if timeline:
            body["timeline"] = [asdict(s) for s in self.timeline]
        return body


class Measures:
    """The running integrals of one replay over its table."""

    def __init__(self, table: OfferTable, hot: float) -> None:
        self.table, self.hot = table, hot
        self._cpu_cap = np.where(table.cpu_cap > 0, table.cpu_cap, 1).astype(np.float64)
        self._mem_cap = np.where(table.mem_cap > 0, table.mem_cap, 1).astype(np.float64)
        self.gpu_total = int(table.ngpu.sum()) * GPU_MILLI
        n = len(table)
        self.host_cpu = np.zeros(n)
        self.host_mem = np.zeros(n)
        self.hot_cpu = self.hot_mem = self.cpu_time = self.mem_time = self.gpu_time = 0.0
        self._gpu_hosts = table.ngpu > 0  # the hosts a GPU figure is of
        self._gpu_cap = (table.ngpu[self._gpu_hosts] * GPU_MILLI).astype(np.float64)
        self.hot_gpu = 0.0
        self.span = 0.0
        self.running = 0
        self.gpu_used = 0
        self._dirty = True
        self._cpu_u = np.zeros(n)
        self._mem_u = np.zeros(n)
        self._waits: list[float] = []
        self._wait_counts: list[int] = []
        self.timeline: list[Sample] = []
        self._stranded = np.zeros(2)  # summed over the placements tried: cpu, memory %
        self._tries = 0
        self.first = self.last = 0.0
        self._next_sample = 0.0
        self._step = 1.0

    def start(self, t: float, step: float) -> None:
        self.first = self.last = self._next_sample = t
        self._step = step

    def changed(self, rows: Any, instances: int, gpu_milli: int) -> None:
        self.running += instances
        self.gpu_used += gpu_milli
        self._dirty = True

    def started(self, wait: float, count: int) -> None:
        self._waits.append(wait)
        self._wait_counts.append(count)

    def fragmented(self, no_room: npt.NDArray[np.bool_]) -> None:
        """A placement is tried; ``no_room``: the hosts that cannot take one instance of it."""
        t = self.table
        for k, (cap, used) in enumerate(((t.cpu_cap, t.cpu_used), (t.mem_cap, t.mem_used))):
            free = cap - used
            total = float(free.sum())
            self._stranded[k] += 100 * float(free[no_room].sum()) / total if total > 0 else 0.0
        self._tries += 1

    def _utils(self) -> tuple[Floats, Floats]:
        if self._dirty:
            t = self.table
            self._cpu_u = t.cpu_used / self._cpu_cap
            self._mem_u = t.mem_used / self._mem_cap
            self._dirty = False
        return self._cpu_u, self._mem_u

    def advance(self, now: float, queued: int, head: float | None) -> None:
        """The fleet as it stands held from the last event until ``now``."""
        dt = now - self.last
        if dt <= 0:
            return
        cpu, mem = self._utils()
        while self._next_sample < now:
            self._sample(self._next_sample, queued, head)
            self._next_sample += self._step
        self.host_cpu += cpu * dt
        self.host_mem += mem * dt
        self.hot_cpu += int(np.count_nonzero(cpu > self.hot)) * dt
        self.hot_mem += int(np.count_nonzero(mem > self.hot)) * dt
        if self.gpu_total:
            free = self.table.gpu_free[self._gpu_hosts].sum(axis=1)
            gpu = 1.0 - free / self._gpu_cap
            self.hot_gpu += int(np.count_nonzero(gpu > self.hot)) * dt
        self.cpu_time += float(self.table.cpu_used.sum()) * dt
        self.mem_time += float(self.table.mem_used.sum()) * dt
        self.gpu_time += self.gpu_used * dt
        self.span += dt
        self.last = now

    def _sample(self, t: float, queued: int, head: float | None) -> None:
        cpu, mem = self._utils()
        table = self.table
        self.timeline.append(
            Sample(
                t=round(t, 3),
                running=self.running,
                queued=queued,
                head_wait=round(t - head, 3) if head is not None else 0.0,
                cpu=_pct(float(table.cpu_used.sum()), float(table.cpu_cap.sum())),
                memory=_pct(float(table.mem_used.sum()), float(table.mem_cap.sum())),
                gpu=_pct(self.gpu_used, self.gpu_total) if self.gpu_total else None,
                host_cpu_p95=round(100 * _nearest(cpu, 95), 3),
                host_cpu_max=round(100 * float(cpu.max()), 3),
                host_memory_p95=round(100 * _nearest(mem, 95), 3),
                host_memory_max=round(100 * float(mem.max()), 3),
            )
        )

    def _hot(self, n: int, span: float) -> dict[str, float]:
        hot = {"cpu": _pct(self.hot_cpu, n * span), "memory": _pct(self.hot_mem, n * span)}
        if self.gpu_total:  # of the hosts with GPUs
            hot["gpu"] = _pct(self.hot_gpu, int(self._gpu_hosts.sum()) * span)
        return hot

    def report(
        self,
        *,
        policy: str,
        settings: Settings,
        tasks: Sequence[Task],
        placed: npt.NDArray[np.int64],
        failed: npt.NDArray[np.int64],
        ends: Floats,
        reasons: dict[str, int],
    ) -> FleetReport:
        self._sample(self.last, 0, None)  # the end: the last departure
        table, span = self.table, self.span or 1.0
        n = len(table)
        utilisation = {
            "cpu": _pct(self.cpu_time, float(table.cpu_cap.sum()) * span),
            "memory": _pct(self.mem_time, float(table.mem_cap.sum()) * span),
        }
        if self.gpu_total:
            utilisation["gpu"] = _pct(self.gpu_time, self.gpu_total * span)
        host_cpu, host_mem = self.host_cpu / span, self.host_mem / span
        waits = np.array(self._waits)
        counts = np.array(self._wait_counts, dtype=np.float64)
        return FleetReport(
            policy=policy,
            batch=settings.batch,
            queue=settings.queue,
            backfill=settings.backfill,
            hosts=n,
            tasks=len(tasks),
            instances=sum(t.instances for t in tasks),
            placed=int(placed.sum()),
            failed=int(failed.sum()),
            failed_by_reason=reasons,
            span_s=(round(self.first, 3), round(self.last, 3)),
            hot_threshold=settings.hot,
            utilisation=utilisation,
            hot=self._hot(n, span),
            host_utilisation={
                "cpu_p95": round(100 * _nearest(host_cpu, 95), 3),
                "cpu_max": round(100 * float(host_cpu.max()), 3),
                "memory_p95": round(100 * _nearest(host_mem, 95), 3),
                "memory_max": round(100 * float(host_mem.max()), 3),
            },
            waits={
                "p50": round(weighted_percentile(waits, counts, 50), 3),
                "p95": round(weighted_percentile(waits, counts, 95), 3),
                "max": round(float(waits.max()), 3) if len(waits) else 0.0,
                "mean": round(float(waits @ counts / counts.sum()), 3) if len(waits) else 0.0,
            },
            jobs=_jobs(tasks, placed, ends),
            fragmentation={
                "cpu": round(float(self._stranded[0]) / max(self._tries, 1), 3),
                "memory": round(float(self._stranded[1]) / max(self._tries, 1), 3),
            },
            timeline=self.timeline,
        )


def _jobs(tasks: Sequence[Task], placed: npt.NDArray[np.int64], ends: Floats) -> dict[str, float]:
    """Completion time and slowdown over the jobs whose every instance ran and left."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    ideal: dict[str, float] = {}
    broken: set[str] = set()
    for i, t in enumerate(tasks):
        job = t.job or f"\0{i}"
        if placed[i] < t.instances or t.duration_s is None:
            broken.add(job)
            continue
        first[job] = min(first.get(job, math.inf), t.arrival_s)
        last[job] = max(last.get(job, -math.inf), float(ends[i]))
        ideal[job] = max(ideal.get(job, -math.inf), t.last_arrival_s + t.duration_s)
    done = [j for j in first if j not in broken]
    if not done:
        return {"completed": 0}
    jct = np.array([last[j] - first[j] for j in done])
    best = np.array([ideal[j] - first[j] for j in done])
    positive = best > 0
    slowdown = jct[positive] / best[positive]
    return {
        "completed": len(done),
        "jct_mean": round(float(jct.mean()), 3),
        "jct_p50": round(_nearest(jct, 50), 3),
        "jct_p95": round(_nearest(jct, 95), 3),
        "jct_max": round(float(jct.max()), 3),
        "slowdown_mean": round(float(slowdown.mean()), 4) if len(slowdown) else 1.0,
        "slowdown_p95": round(_nearest(slowdown, 95), 4) if len(slowdown) else 1.0,
        "slowdown_max": round(float(slowdown.max()), 4) if len(slowdown) else 1.0,
    }


def _pct(used: float, total: float) -> float:
    return round(100 * used / total, 3) if total else 0.0
