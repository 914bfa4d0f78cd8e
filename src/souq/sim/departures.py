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

Priority classes (``Task.priority_class``, ``max_price``; :mod:`souq.sim.classes`): a create
that fits nowhere may displace at most ``preempt`` machines of a lower class, through the
broker's auction and the workers' admission (:mod:`souq.sim.cluster`); a displaced task waits
in a queue of its own and starts over when room comes (tried after each departure, the longest
waiting first, until one does not fit); the report tells per class what was placed, refused,
displaced, how long the displaced waited and the work they lost, and the allocation over a
fixed window (the trace's arrivals) that runs of one trace compare over.

Pure: the caller reads the trace and prints the report.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from souq.clock import VirtualClock
from souq.errors import InvalidInput, SouqError
from souq.market import Rules
from souq.market.preemption import DEFAULT_MAX_VICTIMS, RANK, may_displace
from souq.model.constraint import Constraint, ConstraintOperator
from souq.model.placement import Placement
from souq.model.policy import PlacementDefaults, PlacementPolicy
from souq.model.reasons import Reason
from souq.model.resources import GPU_MILLI, Resources
from souq.placement import Pipeline, build_pipeline
from souq.placement.fragmentation import DEFAULT_WORKLOAD
from souq.placement.gpu_scorers import MAX_CPU, MAX_GPU
from souq.sim.classes import ClassTally, Window
from souq.sim.cluster import Evicted, Placed, VirtualCluster
from souq.sim.departures_report import Outcome, Report, Sample, pct, percentile
from souq.sim.host_time import HostTime
from souq.sim.traces import Node, Task, trace_window
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


# -- the replay -------------------------------------------------------------------------------


# How far a rejected worker was from taking the machine: 0, of the right kind but short of
# capacity (insufficient_cpu, _memory, _gpus, _gpu_share ..., and any reason not named here);
# 1, ruled out by where the app's other machines are; 2, not of the kind the request asks
# (its constraints, GPU model, driver); 3, out of play (cordoned, draining, another region).
_DISTANCE: dict[str, int] = {
    Reason.DISTINCT_WORKERS: 1,
    Reason.STANDBY_PRIMARY: 1,
    Reason.CONSTRAINT: 2,
    Reason.WRONG_GPU_MODEL: 2,
    Reason.DRIVER_MISSING: 2,
    Reason.CORDONED: 3,
    Reason.DRAINING: 3,
    Reason.WRONG_REGION: 3,
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
        preempt: int = DEFAULT_MAX_VICTIMS,
        window: tuple[float, float] | None = None,
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
        self.cluster.on_preempted = self._preempted
        self.preempt = preempt
        # A class displaces only when the trace has a class below it (else a create that fits
        # nowhere would ask for offers a second time to find nobody to displace).
        present = {t.priority_class for t in tasks}
        self._displaces = {c for c in RANK if any(may_displace(c, p) for p in present)}
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
        # Allocation over a fixed window (the trace's own span unless given), told at the
        # trace's times.
        start, stop = window or trace_window(tasks)
        self._window = Window(start + self._offset, stop + self._offset, self._totals)
        self._running = 0
        self._outcomes: list[list[Outcome]] = [[] for _ in self.tasks]
        self._samples: list[Sample] = []
        # The broker places one create at a time: one that arrives while another is placed
        # waits for it, so that it is ranked against a book charged with every claim before it.
        self._placing = False
        self._waiting: deque[_Create] = deque()
        # Priority classes: what each class saw; the machines running (to find a displaced
        # one's task); the displaced tasks waiting to be placed again, FIFO, with when each
        # was displaced; whether one of them is being tried (and whether room came meanwhile).
        self.tally = ClassTally()
        self._live: dict[str, _Live] = {}
        self._requeue: deque[tuple[int, float]] = deque()
        self._retrying = False
        self._freed_meanwhile = False

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
        for index, _ in self._requeue:  # displaced, and not placed again before the end
            self.tally.waiting_at_end[self.tasks[index].priority_class] += 1
        self._host_time.advance(max(end, clock.monotonic()))
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
            classes=self.tally.as_json(),
            preempt=self.preempt,
            window_s=(self._window.start - self._offset, self._window.end - self._offset),
            window_utilisation=self._window.utilisation(),
        )

    def _arrival(self, index: int) -> Callable[[], None]:
        def arrive() -> None:
            self._submit(_Create(index, self.tasks[index].instances))

        return arrive

    def _submit(self, create: _Create) -> None:
        if self._placing:
            self._waiting.append(create)
        else:
            self._start(create)

    def _start(self, create: _Create) -> None:
        task = self.tasks[create.index]
        want, constraints = request_of(task)
        self._placing = True

        def done(placed: Placed) -> None:
            self._placed(create, want, placed)
            self._placing = False
            if self._waiting:
                self._start(self._waiting.popleft())

        self.cluster.create(
            self.broker,
            app=APP,
            region=REGION,
            resources=want,
            count=create.count,
            constraints=constraints,
            on_done=done,
            priority_class=task.priority_class,
            max_price=task.max_price,
            preempt=self.preempt if task.priority_class in self._displaces else 0,
        )

    def _placed(self, create: _Create, want: Resources, placed: Placed) -> None:
        index = create.index
        task = self.tasks[index]
        now = self.cluster.clock.monotonic()
        failed = placed.error is not None or not placed.workers
        if create.since is not None:  # a displaced task, tried again
            self._retried(create, failed, now)
        if failed and create.since is None:
            reason = failure_reason(placed)
            names = _names(task)
            self._outcomes[index] = [Outcome(name, None, reason) for name in names]
            self.tally.arrived[task.priority_class] += len(names)
            self.tally.refused[task.priority_class] += len(names)
        elif not failed:
            names = _names(task) if create.since is None else [task.name] * create.count
            for k, name in enumerate(names):
                worker_id, machine_id = placed.workers[k], placed.machines[k]
                if create.since is None:
                    self._outcomes[index].append(Outcome(name, worker_id))
                    self.tally.arrived[task.priority_class] += 1
                    self.tally.placed[task.priority_class] += 1
                self._charge(worker_id, want, +1)
                self._live[machine_id] = _Live(index, want, now)
                if task.duration_s is not None:
                    if create.since is None:
                        leave = task.arrival_s + task.duration_s + self._offset
                        leave = max(leave, now)  # placed after a wait
                    else:
                        leave = now + task.duration_s  # it starts over
                    self.cluster.clock.call_at(leave, self._departure(worker_id, machine_id, want))
        if self._every is None:
            self._sample()

    def _departure(self, worker_id: str, machine_id: str, want: Resources) -> Callable[[], None]:
        def leave() -> None:
            if self._live.pop(machine_id, None) is None:
                return  # displaced before its end: it left then
            self.cluster.destroy(worker_id, machine_id)
            self._charge(worker_id, want, -1)
            if self._every is None:
                self._sample()
            self._freed_meanwhile = True
            self._retry()

        return leave

    # -- priority classes ----------------------------------------------------------------------

    def _preempted(self, evicted: Evicted) -> None:
        """A worker displaced one of the trace's machines: it gives its room back now, its
        work is lost, and its task waits to be placed again."""
        live = self._live.pop(evicted.machine_id, None)
        if live is None:
            return
        task = self.tasks[live.index]
        self._charge(evicted.worker_id, live.want, -1)
        ran = evicted.at - live.started
        self.tally.displaced(task.priority_class, ran_s=ran, millicpus=live.want.millicpus)
        self._requeue.append((live.index, evicted.at))

    def _retry(self) -> None:
        """Room came: try the displaced task that waited longest (one create at a time)."""
        if self._retrying or not self._requeue:
            return
        self._retrying, self._freed_meanwhile = True, False
        index, since = self._requeue.popleft()
        self._submit(_Create(index, 1, since))

    def _retried(self, create: _Create, failed: bool, now: float) -> None:
        self._retrying = False
        assert create.since is not None
        if failed:
            self._requeue.appendleft((create.index, create.since))
            if not self._freed_meanwhile:
                return  # no room came while it was tried: wait for the next departure
        else:
            self.tally.placed_again(self.tasks[create.index].priority_class, now - create.since)
        self.cluster.clock.call_later(0, self._retry)

    def _charge(self, worker_id: str, want: Resources, sign: int) -> None:
        index = self._index[worker_id]
        self._host_time.charge(index, want, sign, self.cluster.clock.monotonic())
        self._used_cpu[index] += sign * want.millicpus
        used = self._used
        used[0] += sign * want.millicpus
        used[1] += sign * want.memory_mb
        used[2] += sign * (want.gpus * GPU_MILLI + want.gpu_milli)
        gpu = sign * (want.gpus * GPU_MILLI + want.gpu_milli)
        now = self.cluster.clock.monotonic()
        self._window.change(now, sign * want.millicpus, sign * want.memory_mb, gpu)
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
                cpu=pct(used[0], totals[0]),
                memory=pct(used[1], totals[1]),
                gpu=pct(used[2], totals[2]),
                worker_cpu_p50=round(percentile(util, 50), 3),
                worker_cpu_p95=round(percentile(util, 95), 3),
                worker_cpu_max=round(float(util.max()) if len(util) else 0.0, 3),
            )
        )


@dataclass(frozen=True, slots=True)
class _Create:
    """A create the broker places: ``count`` machines of task ``index``; ``since``: when the
    task was displaced (None: it arrives)."""

    index: int
    count: int
    since: float | None = None


@dataclass(frozen=True, slots=True)
class _Live:
    """A machine of the trace that runs: its task, size and start."""

    index: int
    want: Resources
    started: float


def _names(task: Task) -> list[str]:
    if task.instances == 1:
        return [task.name]
    return [f"{task.name}/{k}" for k in range(task.instances)]


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
    preempt: int = DEFAULT_MAX_VICTIMS,
    window: tuple[float, float] | None = None,
) -> Report:
    """Replay ``tasks`` on ``workers`` through ``pipeline`` (default: the broker's pipeline
    for ``policy``, best-fit when none; a GPU policy measures fragmentation against the tasks'
    typical shapes and scales by the largest worker); a sample after every event, or every
    ``sample_every_s`` virtual seconds. A create that fits nowhere may displace at most
    ``preempt`` machines of a lower class (0: none), as the broker's ``preempt_max_victims``.
    ``window``: the span (the trace's times) the report's ``window_utilisation`` is over
    (default: the trace's own, :func:`~souq.sim.traces.trace_window`)."""
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
        preempt=preempt,
        window=window,
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
