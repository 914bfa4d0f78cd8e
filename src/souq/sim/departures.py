"""Replaying a generic trace with departures on virtual time, through Souq's own placement.

Each task of the trace (:class:`~souq.sim.traces.Task`) is a create of its ``instances``
machines sized from it, started at ``arrival_s`` on a :class:`~souq.sim.cluster.VirtualCluster`
(the real book, auction and pipeline in one broker; the real admission in every worker): one
batch create (the broker's batch path, all or none), or with ``batch=False`` (and for a
staggered task) one create per instance. The broker places one create at a time, in arrival
order: one that arrives while another is being placed waits for it, so that it is ranked
against a book charged with each claim before it (a burst of creates arriving in the same
second is placed as the broker would place it, not each against the book as it was before the
burst); a create takes a round trip or two of virtual time (``hop_s`` each way). A placed
machine is destroyed at ``arrival_s + duration_s`` (its worker's admission gives its resources
back; at once if its create was placed later than that), and a create that cannot be placed
fails for good (no retry), counted under one reason from its placement record
(:func:`failure_reason`: ``insufficient_cpu``, ``wrong_gpu_model`` ...).

As a task asks: ``cpu_milli`` millicores, ``memory_mib`` MiB; ``num_gpu`` whole GPUs, or a share
of one (``gpu_milli`` thousandths) when ``num_gpu == 1`` and ``gpu_milli < 1000``; a
``gpu_spec`` of one model is ``gpu_model``, of several a constraint ``label.gpu_model in [...]``
(each worker is labelled with its GPUs' model).

What is measured, after every event or every ``sample_every_s`` virtual seconds (a
:class:`Sample`): what the cluster has allocated (CPU, memory, GPU %), and how hot its workers
run: each worker's reserved CPU over its capacity, as percentiles over the workers
(nearest rank: the p95 is the value 95 % of the workers are at or below). A policy that makes
hot spots shows a p95 far above the cluster's mean.

Pure: the caller reads the trace and prints the report.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from souq.clock import VirtualClock
from souq.errors import InvalidInput, SouqError
from souq.market import Rules
from souq.model.constraint import Constraint, ConstraintOperator
from souq.model.placement import Placement
from souq.model.policy import PlacementDefaults, PlacementPolicy
from souq.model.resources import GPU_MILLI, Resources
from souq.placement import Pipeline, build_pipeline
from souq.placement.fragmentation import DEFAULT_WORKLOAD
from souq.placement.gpu_scorers import MAX_CPU, MAX_GPU
from souq.sim.cluster import Placed, VirtualCluster
from souq.sim.host_time import HostTime
from souq.sim.traces import Node, Task
from souq.sim.workload import typical_pods

__all__ = [
    "REGION",
    "Outcome",
    "Replay",
    "Report",
    "Sample",
    "closest_reason",
    "failure_reason",
    "one_by_one",
    "parse_workers",
    "percentile",
    "replay",
    "request_of",
    "speed_up",
    "workers_of",
]

REGION = "sim"  # the one region of a replayed cluster
APP = "trace"
GPU_MODEL_LABEL = "gpu_model"
HOP_S = 0.0005  # one message's travel: small next to the trace's seconds
_GROUP = re.compile(
    r"^\s*(?:(?P<count>\d+)\s*x\s*)?(?P<cpus>\d+(?:\.\d+)?)\s*/\s*(?P<memory>\d+)\s*"
    r"(?P<unit>[mg](?:i?b)?)?\s*(?:/\s*(?P<gpus>\d+)\s*(?::\s*(?P<model>[A-Za-z0-9_.-]+))?)?\s*$",
    re.IGNORECASE,
)


# -- the cluster and the requests -------------------------------------------------------------


def parse_workers(spec: str) -> list[Resources]:
    """Workers from ``COUNTxCPUS/MEMORY[/GPUS[:MODEL]]`` groups joined by ``+``: memory in MiB,
    or with ``G`` (GiB) or ``M``; e.g. ``1000x32/128G`` or ``8x96/768G/8:V100M32+4x32/64G``."""
    workers: list[Resources] = []
    for part in spec.split("+"):
        match = _GROUP.match(part)
        if match is None:
            raise InvalidInput(
                f"workers {part.strip()!r} is not COUNTxCPUS/MEMORY[/GPUS[:MODEL]]",
                hint="e.g. 1000x32/128G (1,000 workers of 32 cpus and 128 GiB) or "
                "8x96/768G/8:V100M32; join groups with +",
                details={"field": "workers"},
            )
        count = int(match["count"] or 1)
        memory = int(match["memory"]) * (1024 if (match["unit"] or "m")[0] in "gG" else 1)
        gpus = int(match["gpus"] or 0)
        model = match["model"] if gpus else None
        if count < 1 or float(match["cpus"]) <= 0 or memory <= 0:
            raise InvalidInput(
                f"workers {part.strip()!r}: a count, cpus and memory above zero",
                details={"field": "workers"},
            )
        capacity = Resources(
            cpus=float(match["cpus"]), memory_mb=memory, gpus=gpus, gpu_model=model
        )
        workers += [capacity] * count
    return workers


def workers_of(nodes: Iterable[Node]) -> list[Resources]:
    """The capacity of each node of a trace (openb's node list)."""
    return [
        Resources(
            cpus=n.cpu_milli / 1000,
            memory_mb=n.memory_mib,
            gpus=n.gpus,
            gpu_model=(n.model or None) if n.gpus else None,
        )
        for n in nodes
    ]


def request_of(task: Task) -> tuple[Resources, tuple[Constraint, ...]]:
    """What a task's machine asks: its resources, and the constraint of a ``gpu_spec`` that
    names several models."""
    gpus = share = 0
    model = None
    constraints: tuple[Constraint, ...] = ()
    if task.num_gpu > 0:
        if task.num_gpu == 1 and task.gpu_milli < GPU_MILLI:
            share = task.gpu_milli
        else:
            gpus = task.num_gpu
        if len(task.gpu_spec) == 1:
            model = task.gpu_spec[0]
        elif task.gpu_spec:
            constraints = (
                Constraint(
                    attribute=f"label.{GPU_MODEL_LABEL}",
                    operator=ConstraintOperator.IN,
                    value=list(task.gpu_spec),
                ),
            )
    want = Resources(
        cpus=task.cpu_milli / 1000,
        memory_mb=task.memory_mib,
        gpus=gpus,
        gpu_milli=share,
        gpu_model=model,
    )
    return want, constraints


# -- what is reported -------------------------------------------------------------------------


def percentile(values: np.ndarray[Any, Any], p: float) -> float:
    """The nearest-rank ``p``-th percentile: the smallest value with at least ``p`` % of the
    values at or below it (0 for no values)."""
    n = len(values)
    if n == 0:
        return 0.0
    k = max(1, math.ceil(p / 100 * n)) - 1
    return float(np.partition(values, k)[k])


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster at virtual time ``t`` (seconds from the trace's start): allocation %, and
    the workers' CPU utilisation (reserved / capacity, %) as percentiles over the workers."""

    t: float
    running: int
    cpu: float
    memory: float
    gpu: float
    worker_cpu_p50: float
    worker_cpu_p95: float
    worker_cpu_max: float


@dataclass(frozen=True, slots=True)
class Outcome:
    """One task: the worker that took it, or why none did."""

    task: str
    worker: str | None
    reason: str | None = None


@dataclass(frozen=True)
class Report:
    policy: str
    workers: int
    tasks: int
    placed: int
    failed_by_reason: dict[str, int]
    samples: list[Sample]
    outcomes: list[Outcome] = field(repr=False)
    has_gpus: bool = False  # whether the workers have GPUs (else no GPU figure is told)
    hot_threshold: float = 0.9  # a fraction of a worker's capacity
    # Per resource (cpu, memory; gpu where the workers have GPUs): the share of worker-time
    # above ``hot_threshold``, %; each worker's time-averaged utilisation, p95 and max, %.
    hot: dict[str, float] = field(default_factory=dict)
    host_utilisation: dict[str, float] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return sum(self.failed_by_reason.values())

    def summary(self) -> dict[str, float]:
        """Over the samples, weighted by time (each holds until the next; all alike when they
        share one instant): the mean allocation %, and the mean and peak of the workers' p95
        and max CPU utilisation. No ``gpu_mean`` when the workers have no GPUs."""
        if not self.samples:
            return {}
        times = [s.t for s in self.samples]
        held = [b - a for a, b in itertools.pairwise(times)] + [0.0]
        span = sum(held)
        weights = held if span > 0 else [1.0] * len(self.samples)
        whole = span if span > 0 else float(len(self.samples))

        def mean(name: str) -> float:
            total = sum(
                float(getattr(s, name)) * w for s, w in zip(self.samples, weights, strict=True)
            )
            return round(total / whole, 3)

        def peak(name: str) -> float:
            return round(max(float(getattr(s, name)) for s in self.samples), 3)

        gpu = {"gpu_mean": mean("gpu")} if self.has_gpus else {}
        return {
            "cpu_mean": mean("cpu"),
            "memory_mean": mean("memory"),
            **gpu,
            "worker_cpu_p95_mean": mean("worker_cpu_p95"),
            "worker_cpu_p95_peak": peak("worker_cpu_p95"),
            "worker_cpu_max_mean": mean("worker_cpu_max"),
        }

    def as_json(self, *, samples: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {
            "policy": self.policy,
            "workers": self.workers,
            "tasks": self.tasks,
            "placed": self.placed,
            "failed": self.failed,
            "failed_by_reason": dict(sorted(self.failed_by_reason.items())),
            "summary": self.summary(),
            "hot_threshold": self.hot_threshold,
            "hot": self.hot,
            "host_utilisation": self.host_utilisation,
        }
        if samples:
            body["samples"] = [asdict(s) for s in self.samples]
        return body


# -- the replay -------------------------------------------------------------------------------


# How far a rejected worker was from taking the machine: 0, of the right kind but short of
# capacity (insufficient_cpu, _memory, _gpus, _gpu_share ..., and any reason not named here);
# 1, ruled out by where the app's other machines are; 2, not of the kind the request asks
# (its constraints, GPU model, driver); 3, out of play (cordoned, draining, another region).
_DISTANCE = {
    "distinct_workers": 1,
    "standby_primary": 1,
    "constraint": 2,
    "wrong_gpu_model": 2,
    "driver_missing": 2,
    "cordoned": 3,
    "draining": 3,
    "wrong_region": 3,
}


def closest_reason(rejections: dict[str, int]) -> str:
    """Of the rejections counted by reason, the one counted most among the workers that came
    closest (the first by name on a tie)."""
    return min(rejections, key=lambda r: (_DISTANCE.get(r, 0), -rejections[r], r))


def failure_reason(placed: Placed) -> str:
    """Why a create failed, in one code: the reason its record counts most among the workers
    that came closest (a full GPU worker's ``insufficient_gpus`` before the CPU workers'
    ``wrong_gpu_model``; the first by name on a tie); else the refused claims', else the
    error's status."""
    record = placed.record
    rejections: dict[str, int] = getattr(record, "rejections", None) or {}
    if rejections:
        return closest_reason(rejections)
    if isinstance(record, Placement) and any(not c.ok for c in record.claims):
        return "claim_refused"
    return placed.error.status if isinstance(placed.error, SouqError) else "not_placed"


class Replay:
    """One replay: the cluster, the tasks' timers, and the measures as they go. ``run()``
    once; ``cluster`` stays for a look afterwards."""

    def __init__(
        self,
        workers: Sequence[Resources],
        tasks: Sequence[Task],
        *,
        pipeline: Pipeline,
        rules: Rules | None = None,
        sample_every_s: float | None = None,
        hop_s: float = HOP_S,
        batch: bool = True,
        hot: float = 0.9,
    ) -> None:
        if sample_every_s is not None and not sample_every_s > 0:
            raise InvalidInput(f"sample every {sample_every_s!r} s: a number of seconds above 0")
        self.cluster = VirtualCluster(
            clock=VirtualClock(), pipeline=pipeline, rules=rules, hop_s=hop_s
        )
        for capacity in workers:
            model = capacity.gpu_model
            labels = {GPU_MODEL_LABEL: model} if model else None
            self.cluster.add_worker(REGION, capacity, labels=labels)
        self.broker = self.cluster.add_broker()
        # A task's instances as one batch create (the broker's batch path: all or none), or
        # each a create of its own; a staggered task's arrive one by one either way.
        self.tasks = [
            t
            for task in tasks
            for t in ([task] if batch and task.stagger_s == 0 else one_by_one([task]))
        ]
        # The virtual clock starts at 0: a trace that begins before its start (negative
        # arrivals) is run that much later, and its samples told at the trace's own times.
        self._offset = max(0.0, -min((t.arrival_s for t in self.tasks), default=0.0))
        self._every = sample_every_s
        first = self._offset + min((t.arrival_s for t in self.tasks), default=0.0)
        self._host_time = HostTime(list(workers), hot=hot, start=first)
        self._index = {w: i for i, w in enumerate(self.cluster.workers)}
        caps = list(workers)
        self._cap_cpu = np.array([c.millicpus for c in caps], dtype=np.float64)
        self._cap_cpu[self._cap_cpu == 0] = np.inf  # a worker without cpus is never busy
        self._used_cpu = np.zeros(len(caps), dtype=np.float64)
        self._totals = (
            sum(c.millicpus for c in caps),
            sum(c.memory_mb for c in caps),
            sum(c.gpus for c in caps) * GPU_MILLI,
        )
        self._used = [0, 0, 0]  # millicpus, MiB, milli-GPU allocated by the tasks running
        self._running = 0
        self._outcomes: list[list[Outcome]] = [[] for _ in self.tasks]
        self._samples: list[Sample] = []
        # The broker places one create at a time: one that arrives while another is placed
        # waits for it, so that it is ranked against a book charged with every claim before it.
        self._placing = False
        self._waiting: deque[int] = deque()

    def run(self) -> Report:
        clock = self.cluster.clock
        for index, task in enumerate(self.tasks):
            clock.call_at(task.arrival_s + self._offset, self._arrival(index))
        # Through the departures: to the last arrival or departure, whichever comes last.
        end = self._offset + max(
            (t.arrival_s + (t.duration_s or 0.0) for t in self.tasks), default=0.0
        )
        if self._every is not None:
            self._tick(0.0, end)
        clock.run(max_steps=None)
        self._host_time.advance(end)
        hot, hosts = self._host_time.report()
        outcomes = [o for each in self._outcomes for o in each]
        failed = Counter(o.reason for o in outcomes if o.reason is not None)
        return Report(
            policy=self.cluster.pipeline.name,
            workers=len(self.cluster.workers),
            tasks=sum(t.instances for t in self.tasks),
            placed=sum(1 for o in outcomes if o.worker is not None),
            failed_by_reason=dict(failed),
            samples=self._samples,
            outcomes=outcomes,
            has_gpus=self._totals[2] > 0,
            hot_threshold=self._host_time.hot,
            hot=hot,
            host_utilisation=hosts,
        )

    def _arrival(self, index: int) -> Callable[[], None]:
        def arrive() -> None:
            if self._placing:
                self._waiting.append(index)
            else:
                self._start(index)

        return arrive

    def _start(self, index: int) -> None:
        task = self.tasks[index]
        want, constraints = request_of(task)
        self._placing = True

        def done(placed: Placed) -> None:
            self._placed(index, want, placed)
            self._placing = False
            if self._waiting:
                self._start(self._waiting.popleft())

        self.cluster.create(
            self.broker,
            app=APP,
            region=REGION,
            resources=want,
            count=task.instances,
            constraints=constraints,
            on_done=done,
        )

    def _placed(self, index: int, want: Resources, placed: Placed) -> None:
        task = self.tasks[index]
        names = (
            [task.name]
            if task.instances == 1
            else [f"{task.name}/{k}" for k in range(task.instances)]
        )
        if placed.error is not None or not placed.workers:
            reason = failure_reason(placed)
            self._outcomes[index] = [Outcome(name, None, reason) for name in names]
        else:
            for k, name in enumerate(names):
                worker_id, machine_id = placed.workers[k], placed.machines[k]
                self._outcomes[index].append(Outcome(name, worker_id))
                self._charge(worker_id, want, +1)
                if task.duration_s is not None:
                    leave = task.arrival_s + task.duration_s + self._offset
                    leave = max(leave, self.cluster.clock.monotonic())  # placed after a wait
                    self.cluster.clock.call_at(leave, self._departure(worker_id, machine_id, want))
        if self._every is None:
            self._sample()

    def _departure(self, worker_id: str, machine_id: str, want: Resources) -> Callable[[], None]:
        def leave() -> None:
            self.cluster.destroy(worker_id, machine_id)
            self._charge(worker_id, want, -1)
            if self._every is None:
                self._sample()

        return leave

    def _charge(self, worker_id: str, want: Resources, sign: int) -> None:
        index = self._index[worker_id]
        self._host_time.charge(index, want, sign, self.cluster.clock.monotonic())
        self._used_cpu[index] += sign * want.millicpus
        used = self._used
        used[0] += sign * want.millicpus
        used[1] += sign * want.memory_mb
        used[2] += sign * (want.gpus * GPU_MILLI + want.gpu_milli)
        self._running += sign

    def _tick(self, at: float, end: float) -> None:
        def tick() -> None:
            self._sample()
            if at < end:
                self._tick(at + (self._every or 0), end)

        self.cluster.clock.call_at(at, tick)

    def _sample(self) -> None:
        util = self._used_cpu / self._cap_cpu * 100
        used, totals = self._used, self._totals
        self._samples.append(
            Sample(
                t=round(self.cluster.clock.monotonic() - self._offset, 6),
                running=self._running,
                cpu=_pct(used[0], totals[0]),
                memory=_pct(used[1], totals[1]),
                gpu=_pct(used[2], totals[2]),
                worker_cpu_p50=round(percentile(util, 50), 3),
                worker_cpu_p95=round(percentile(util, 95), 3),
                worker_cpu_max=round(float(util.max()) if len(util) else 0.0, 3),
            )
        )


def _pct(used: int, total: int) -> float:
    return round(100 * used / total, 3) if total else 0.0


def replay(
    workers: Sequence[Resources],
    tasks: Sequence[Task],
    *,
    policy: PlacementPolicy | None = None,
    pipeline: Pipeline | None = None,
    rules: Rules | None = None,
    sample_every_s: float | None = None,
    batch: bool = True,
    hot: float = 0.9,
) -> Report:
    """Replay ``tasks`` on ``workers`` through ``pipeline`` (default: the broker's pipeline
    for ``policy``, best-fit when none; a GPU policy measures fragmentation against the tasks'
    typical shapes and scales by the largest worker); a sample after every event, or every
    ``sample_every_s`` virtual seconds."""
    if not workers:
        raise InvalidInput("a replay needs at least one worker", hint="give --workers")
    if pipeline is None:
        most_gpus = max(w.gpus for w in workers) * GPU_MILLI
        pipeline = build_pipeline(
            policy,
            PlacementDefaults(),
            workload=typical_pods(t.pod() for t in tasks) if tasks else DEFAULT_WORKLOAD,
            largest=(max(w.millicpus for w in workers) or MAX_CPU, most_gpus or MAX_GPU),
        )
    run = Replay(
        workers,
        tasks,
        pipeline=pipeline,
        rules=rules,
        sample_every_s=sample_every_s,
        batch=batch,
        hot=hot,
    )
    return run.run()


def one_by_one(tasks: Iterable[Task]) -> list[Task]:
    """Each instance of each task as a task of its own (instance ``k`` of a staggered task
    ``k * stagger_s`` later), named ``NAME`` for one instance and ``NAME/k`` for several."""
    out: list[Task] = []
    for t in tasks:
        if t.instances == 1:
            out.append(t)
            continue
        out += [
            replace(t, name=f"{t.name}/{k}", arrival_s=t.arrival_s + k * t.stagger_s, instances=1)
            for k in range(t.instances)
        ]
    return out


def speed_up(tasks: Iterable[Task], factor: float) -> list[Task]:
    """The tasks arriving ``factor`` times as fast (arrivals divided by it, durations kept):
    ``factor`` times the load of a trace as light as openb's."""
    if not factor > 0:
        raise InvalidInput(f"speed-up {factor!r}: a number above 0", details={"field": "speedup"})
    return [
        replace(t, arrival_s=t.arrival_s / factor, stagger_s=t.stagger_s / factor) for t in tasks
    ]
