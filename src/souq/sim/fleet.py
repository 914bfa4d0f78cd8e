"""Replaying a trace at scale: millions of instances on a fleet of hosts, through the broker's
placement stages over columns, with an optional queue.

Each task of the trace (:class:`~souq.sim.traces.Task`) asks for ``instances`` identical
machines. Per run (:class:`Settings`) they are placed

* as **one batch create** (``batch=True``, the default): the task's machines are one app's, the
  book updated by each claim as the broker's is (the anti-affinity scorer counts the batch's
  machines already claimed), all or none (a batch create's ``min_count`` is its count); or
* **one by one**: each instance a create of its own, placed as it comes, in order.

Each claim is ranked by the pipeline a broker builds for the policy (``souq.placement``):
:func:`~souq.sim.columns.evaluate` runs its filters and scorers over every host at once.
A batch's later claims are ranked in the same call: the book after ``k`` more claims on a host is
one more row (:meth:`~souq.sim.columns.OfferTable.after_claims`), so a host's next
``FRONTIER`` claims are scored ahead, and further ones (2x, 4x ... at a time) when a host takes
more. Each claim then goes to the best host as the book stands after the claims before it: the
same winners as ranking the whole book again after every claim. A GPU request is ranked again
after every claim (which GPUs a claim takes is the worker's choice).

A task that does not fit fails (every instance of a batch; the instances left over one by one),
counted under the reason of the closest hosts. With ``queue=True`` it waits instead, first come
first served: nothing behind it is placed before it; it is tried again whenever machines leave.
With ``backfill`` as well, the queue follows the batch-jobs queue's rule (docs/jobs.md): the
oldest of the waiting tasks that fit goes first, and one that does not fit holds up nothing.
A task that would not fit on the empty fleet fails at once rather than block the queue for ever.

What is measured (:class:`FleetReport`), from the first arrival to the last departure:
utilisation per resource weighted by time; hot spots, the share of host-time above ``hot`` of a
resource; each host's time-weighted utilisation, as p95 and max over hosts; waits (arrival to
start, per instance); each job's completion time and its slowdown against an infinite cluster
(no waits); and a timeline (every ``sample_every_s``, through the departures).

Priority classes (:mod:`souq.sim.classes`): a single create (one instance, or one by one; a
batch never displaces, as the broker's does not) that fits nowhere may displace at most
``Settings.preempt`` instances of a lower class (:mod:`souq.sim.fleet_preemption`, the workers'
chooser); a displaced instance waits in a queue of its own, tried after each departure before
the FIFO queue (the longest waiting first, until one does not fit), and starts over. The FIFO
queue knows no classes.

Pure: the caller reads the trace and prints the report.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from souq.errors import InvalidInput
from souq.market.preemption import RANK, may_displace, may_preempt
from souq.model.resources import GPU_MILLI, Resources
from souq.model.worker import WorkerInfo
from souq.placement import Pipeline, PlacementRequest
from souq.sim.arrays import Floats, Ints
from souq.sim.classes import ClassTally, Window
from souq.sim.columns import OfferTable, evaluate, rank_table, reason_name
from souq.sim.departures import closest_reason, request_of
from souq.sim.fleet_preemption import Victim, Victims
from souq.sim.fleet_report import FleetReport, Measures, Settings
from souq.sim.gpu_columns import picked as picked_gpus
from souq.sim.traces import Task, trace_window

__all__ = ["FRONTIER", "Fleet", "FleetReport", "Settings", "replay_fleet"]


REGION = "sim"
FRONTIER = 4  # claims ahead scored per host in a batch's first call
EXTEND = 64  # claims ahead scored for a host that takes more (at least; doubling)
TIMELINE_STEPS = 200  # samples over the trace's span when no step is given
DEFAULT_SETTINGS = Settings()  # frozen: one value for every default


@dataclass(slots=True)
class _Group:
    """Instances of one task placed at one moment: where, and how many on each host."""

    task: int
    rows: Ints
    counts: Ints
    gpus: list[Ints] | None = None  # a GPU task's GPUs taken, per claim (rows repeat)
    victims: dict[str, int] = field(default_factory=dict)  # its displaceable instances' hosts


@dataclass(slots=True)
class _Waiting:
    task: int
    count: int
    arrival: float


class Fleet:
    """The hosts as columns (:class:`OfferTable`) and the run over them. ``run()`` once."""

    def __init__(
        self,
        hosts: Sequence[Resources],
        tasks: Sequence[Task],
        *,
        pipeline: Pipeline,
        settings: Settings = DEFAULT_SETTINGS,
    ) -> None:
        if not hosts:
            raise InvalidInput("a replay needs at least one host", hint="give --workers")
        if settings.sample_every_s is not None and not settings.sample_every_s > 0:
            raise InvalidInput(f"sample every {settings.sample_every_s!r} s: seconds above 0")
        self.pipeline, self.settings, self.tasks = pipeline, settings, list(tasks)
        self.table = OfferTable.of(
            [
                WorkerInfo(
                    id=f"h{i:06d}",
                    region=REGION,
                    capacity=c,
                    allocated=Resources(cpus=0, memory_mb=0),
                )
                for i, c in enumerate(hosts)
            ]
        )
        self._rng = np.random.default_rng(settings.seed)
        self._random = random.Random(settings.seed)
        self._wants: dict[tuple[Any, ...], tuple[Resources, tuple[Any, ...]]] = {}
        self._departures: list[tuple[float, int, _Group]] = []
        self._seq = 0
        self._queue: deque[_Waiting] = deque()
        self.measures = Measures(self.table, settings.hot)
        self._empty_fits: dict[int, int] = {}
        n = len(self.tasks)
        self.placed = np.zeros(n, dtype=np.int64)
        self.failed = np.zeros(n, dtype=np.int64)
        self.ends = np.full(n, -np.inf)  # each task's last instance's end
        self.reasons: Counter[str] = Counter()
        # Priority classes: the instances that can be displaced (only of a class below one the
        # trace has), the displaced instances waiting to be placed again (FIFO), per class.
        self.victims = Victims(self.table, list(hosts))
        self.tally = ClassTally()
        self._requeue: deque[_Waiting] = deque()
        present = {t.priority_class for t in self.tasks}
        self._displaceable = {c for c in RANK if any(may_displace(p, c) for p in present)}
        t = self.table
        totals = (int(t.cpu_cap.sum()), int(t.mem_cap.sum()), int(t.ngpu.sum()) * GPU_MILLI)
        self.window = Window(*(settings.window or trace_window(self.tasks)), totals)

    # -- the requests --------------------------------------------------------------------------

    def _want(self, index: int) -> tuple[Resources, tuple[Any, ...]]:
        t = self.tasks[index]
        key = (t.cpu_milli, t.memory_mib, t.num_gpu, t.gpu_milli, t.gpu_spec)
        got = self._wants.get(key)
        if got is None:
            got = self._wants[key] = request_of(t)
        return got

    def _request(self, index: int) -> PlacementRequest:
        want, constraints = self._want(index)
        return PlacementRequest(
            request_id=f"task-{index}",
            app=f"task-{index}",
            region=REGION,
            resources=want,
            constraints=constraints,
        )

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> FleetReport:
        times, order, counts = self._arrivals()
        start = float(times[0]) if len(times) else 0.0
        end_guess = max(
            [t.last_arrival_s + (t.duration_s or 0.0) for t in self.tasks], default=start
        )
        step = self.settings.sample_every_s or max((end_guess - start) / TIMELINE_STEPS, 1e-9)
        self.measures.start(start, step)
        k, total = 0, len(times)
        while k < total or self._departures:
            arrival = float(times[k]) if k < total else math.inf
            if self._departures and self._departures[0][0] <= arrival:
                now = self._departures[0][0]
                self.measures.advance(now, *self._waiting())
                while self._departures and self._departures[0][0] == now:
                    self._leave(heapq.heappop(self._departures)[2])
                self._retry(now)
                self._drain(now)
                continue
            self.measures.advance(arrival, *self._waiting())
            self._arrive(int(order[k]), int(counts[k]), arrival)
            k += 1
        for waiting in self._queue:  # never placed: the trace ended first
            self._fail(waiting.task, waiting.count, "queued_at_end")
        for waiting in self._requeue:  # displaced, and not placed again before the end
            self.tally.waiting_at_end[self.tasks[waiting.task].priority_class] += waiting.count
        return self._report()

    def _waiting(self) -> tuple[int, float | None]:
        """Tasks queued, and when the one at the head arrived (None: none waits)."""
        return len(self._queue), self._queue[0].arrival if self._queue else None

    def _arrivals(self) -> tuple[Floats, Ints, Ints]:
        """When each arrival comes, whose it is and how many instances: a task at once, or each
        instance of a staggered task at its own time."""
        times: list[float] = []
        owner: list[int] = []
        counts: list[int] = []
        for i, t in enumerate(self.tasks):
            if t.stagger_s > 0 and t.instances > 1:
                times += [t.arrival_s + j * t.stagger_s for j in range(t.instances)]
                owner += [i] * t.instances
                counts += [1] * t.instances
            else:
                times.append(t.arrival_s)
                owner.append(i)
                counts.append(t.instances)
        at = np.array(times, dtype=np.float64)
        who = np.array(owner, dtype=np.int64)
        sort = np.lexsort((who, at))
        return at[sort], who[sort], np.array(counts, dtype=np.int64)[sort]

    def _arrive(self, index: int, count: int, now: float) -> None:
        self.tally.arrived[self.tasks[index].priority_class] += count
        if not self.settings.queue:
            placed = self._place(index, count, now, now)
            self._fail(index, count - placed)
            return
        if self._never_fits(index, count):
            self._fail(index, count, "never_fits")
            return
        waiting = _Waiting(index, count, now)
        self._queue.append(waiting)
        if len(self._queue) == 1:
            self._drain(now)
        elif self.settings.backfill:
            self._try(waiting, now)
            if waiting.count == 0:
                self._queue.pop()

    def _drain(self, now: float) -> None:
        """Machines left (or a task came to an empty queue): place what waits, in its order.
        FIFO stops at the first task that does not fit; backfill goes on past it."""
        if not self.settings.backfill:
            while self._queue:
                if not self._try(self._queue[0], now):
                    return
                self._queue.popleft()
            return
        done = [self._try(w, now) for w in self._queue]  # every one tried, in order
        if any(done):
            self._queue = deque(w for w in self._queue if w.count > 0)

    def _try(self, waiting: _Waiting, now: float) -> bool:
        """Place what ``waiting`` still asks for; whether all of it is placed now."""
        waiting.count -= self._place(waiting.task, waiting.count, now, waiting.arrival)
        return waiting.count == 0

    def _fail(self, index: int, count: int, reason: str | None = None) -> None:
        if count <= 0:
            return
        self.failed[index] += count
        self.reasons[reason or self._why(index)] += count
        self.tally.refused[self.tasks[index].priority_class] += count

    def _why(self, index: int) -> str:
        ev = evaluate(self.pipeline, self._request(index), self.table)
        codes = np.bincount(ev.reason[~ev.ok])
        rejections = {reason_name(c): int(n) for c, n in enumerate(codes) if n and c}
        return closest_reason(rejections) if rejections else "batch_does_not_fit"

    # -- placing ------------------------------------------------------------------------------

    def _fits(self, want: Resources, free: bool = False) -> Ints:
        """How many machines of ``want`` each host has room for (now, or empty)."""
        t = self.table
        room = np.full(len(t), np.iinfo(np.int64).max // 4, dtype=np.int64)
        for need, cap, used in (
            (want.millicpus, t.cpu_cap, t.cpu_used),
            (want.memory_mb, t.mem_cap, t.mem_used),
            (want.disk_mb, t.disk_cap, t.disk_used),
        ):
            if need > 0:
                room = np.minimum(room, (cap - (0 if free else used)) // need)
        room[t.closed] = 0
        return np.maximum(room, 0)

    def _never_fits(self, index: int, count: int) -> bool:
        want, _ = self._want(index)
        if want.wants_gpu:
            return False
        need = count if self.settings.batch else 1
        key = id(want)
        if key not in self._empty_fits:
            self._empty_fits[key] = int(self._fits(want, free=True).sum())
        return self._empty_fits[key] < need

    def _place(
        self, index: int, count: int, now: float, arrival: float, *, again: bool = False
    ) -> int:
        """Place up to ``count`` instances of task ``index`` (all or none in a batch); the
        number placed. A single create (one instance, or one by one) that fits nowhere may
        displace lower classes. ``again``: a displaced instance placed again (``arrival``:
        when it was displaced)."""
        want, _ = self._want(index)
        request = self._request(index)
        if want.wants_gpu:
            group = self._claim_gpus(request, index, count)
        else:
            group = self._claim(request, index, count)
        placed = 0
        if group is not None and int(group.counts.sum()) > 0:
            placed = self._start(group, want, now, arrival, again)
        single = count == 1 or not self.settings.batch
        while placed < count and single and self.settings.preempt > 0:
            group = self._displace(index, request, now)
            if group is None:
                break
            placed += self._start(group, want, now, arrival, again)
        return placed

    def _start(
        self, group: _Group, want: Resources, now: float, arrival: float, again: bool
    ) -> int:
        index = group.task
        placed = int(group.counts.sum())
        self._apply(group, want, +1)
        task = self.tasks[index]
        if again:
            self.tally.placed_again(task.priority_class, now - arrival, placed)
        else:
            self.placed[index] += placed
            self.measures.started(now - arrival, placed)
            self.tally.placed[task.priority_class] += placed
        if task.priority_class in self._displaceable:
            self._enlist(group, want, now)
        if task.duration_s is not None:
            end = now + task.duration_s
            self.ends[index] = max(self.ends[index], end)
            self._seq += 1
            heapq.heappush(self._departures, (end, self._seq, group))
        else:
            self.ends[index] = math.inf
        return placed

    # -- priority classes ----------------------------------------------------------------------

    def _enlist(self, group: _Group, want: Resources, now: float) -> None:
        """The group's instances as machines a higher class may displace."""
        task = self.tasks[group.task]
        for position, (row, count) in enumerate(zip(group.rows, group.counts, strict=True)):
            gpus = group.gpus[position] if group.gpus is not None else None
            for _ in range(int(count)):
                victim_id = self.victims.add(
                    int(row),
                    app=f"task-{group.task}",
                    klass=task.priority_class,
                    want=want,
                    price=task.max_price,
                    now=now,
                    group=group,
                    position=position,
                    gpus=gpus,
                )
                if victim_id is not None:
                    group.victims[victim_id] = int(row)

    def _displace(self, index: int, request: PlacementRequest, now: float) -> _Group | None:
        """One instance of task ``index`` on a host where displacing lower classes makes room
        (:meth:`Victims.choose`); the victims wait to be placed again. None: none would do."""
        klass = self.tasks[index].priority_class
        if not may_preempt(klass) or not self.victims:
            return None
        chosen = self.victims.choose(self.pipeline, request, klass, self.settings.preempt)
        if chosen is None:
            return None
        row, plan = chosen
        for candidate in plan.victims:
            victim = self.victims.remove(row, candidate.machine_id)
            assert victim is not None
            self._evict(row, candidate.machine_id, victim, now)
        want = request.resources
        gpus = None
        if want.wants_gpu:
            before = self.table.gpu_free[row].copy()
            gpus = [before - picked_gpus(want, before[None, :])[0]]
        one = np.ones(1, dtype=np.int64)
        return _Group(index, np.array([row], dtype=np.int64), one, gpus)

    def _evict(self, row: int, victim_id: str, victim: Victim, now: float) -> None:
        """Give a displaced instance's room back; it waits to be placed again."""
        group: _Group = victim.group
        group.counts[victim.position] -= 1
        group.victims.pop(victim_id, None)
        want, _ = self._want(group.task)
        rows = np.array([row], dtype=np.int64)
        gpu_milli = 0
        if victim.gpus is not None and group.gpus is not None:
            self.table.gpu_free[row] += victim.gpus
            gpu_milli = int(victim.gpus.sum())
            group.gpus[victim.position] = np.zeros_like(victim.gpus)
        t = self.table
        t.cpu_used[row] -= want.millicpus
        t.mem_used[row] -= want.memory_mb
        t.disk_used[row] -= want.disk_mb
        t.version[row] += 1
        self.measures.changed(rows, -1, -gpu_milli)
        self.window.change(now, -want.millicpus, -want.memory_mb, -gpu_milli)
        klass = self.tasks[group.task].priority_class
        self.tally.displaced(klass, ran_s=now - victim.started, millicpus=want.millicpus)
        self._requeue.append(_Waiting(group.task, 1, now))

    def _retry(self, now: float) -> None:
        """Room came: place the displaced instances again, the longest waiting first, until
        one does not fit."""
        while self._requeue:
            waiting = self._requeue[0]
            if self._place(waiting.task, 1, now, waiting.arrival, again=True) < 1:
                return
            self._requeue.popleft()

    def _claim(self, request: PlacementRequest, index: int, count: int) -> _Group | None:
        """A CPU, memory and disk request: the claims one after another on the book each
        leaves, ranked ahead (see the module's docstring)."""
        want = request.resources
        fits = self._fits(want)
        self.measures.fragmented(fits == 0)
        batch = self.settings.batch
        if int(np.minimum(fits, count).sum()) < (count if batch else 1):
            return None  # not enough room anywhere (the filters would say so too)
        hosts = np.flatnonzero(fits > 0)
        first = self.pipeline.first_wins(request, bool((self.table.ngpu[hosts] > 0).any()))
        ahead = FRONTIER if count > 1 else 0
        levels = self._scores(request, hosts, 0, ahead + 1)
        taken = np.zeros(len(hosts), dtype=np.int64)
        extra: dict[int, tuple[int, Floats]] = {}

        def after(j: int, level: int) -> float:
            """Host j's score for one more claim once it holds ``level`` of the batch."""
            if level <= ahead:
                return float(levels[j, level])
            base, more = extra.get(j, (0, levels[j, :0]))
            if not base <= level < base + len(more):
                size = min(max(2 * len(more), EXTEND), count - placed + 1)
                base, more = level, self._scores(request, hosts[j : j + 1], level, size)[0]
                extra[j] = base, more
            return float(more[level - base])

        # The best host first: a heap of (-score, tie key, host); ties go to the smallest id
        # under ``first`` (the key is the host's place), else to a random one (a fresh random
        # key per entry: each of the tied is as likely to come first).
        rand = self._random.random
        heap = [
            (-float(v), j if first else rand(), j)
            for j, v in enumerate(levels[:, 0].tolist())
            if v != -np.inf
        ]
        heapq.heapify(heap)
        placed = 0
        while placed < count and heap:
            _, _, j = heapq.heappop(heap)
            taken[j] += 1
            placed += 1
            if placed == count:
                break
            score = after(j, int(taken[j]))
            if score != -np.inf:
                heapq.heappush(heap, (-score, j if first else rand(), j))
        if batch and placed < count:
            return None
        used = taken > 0
        return _Group(index, hosts[used], taken[used])

    def _scores(self, request: PlacementRequest, hosts: Ints, first: int, size: int) -> Floats:
        """Each host's final score for one more claim after ``first``, ``first + 1`` ...
        (``size`` of them) claims of this request: ``-inf`` where it would not pass."""
        if size <= 0:
            return np.full((len(hosts), 0), -np.inf)
        rows = np.repeat(hosts, size)
        claims = np.tile(np.arange(first, first + size, dtype=np.int64), len(hosts))
        app = claims if self.settings.batch else np.zeros(len(rows), dtype=np.int64)
        table = self.table.after_claims(rows, claims, request.resources, app)
        return evaluate(self.pipeline, request, table).score.reshape(len(hosts), size)

    def _claim_gpus(self, request: PlacementRequest, index: int, count: int) -> _Group | None:
        """A GPU request: ranked over the whole book again after every claim."""
        t, want = self.table, request.resources
        rows: list[int] = []
        taken: list[Ints] = []
        for _ in range(count):
            winner = rank_table(self.pipeline, request, t, rng=self._rng).winner
            if winner is None:
                break
            before = t.gpu_free[winner].copy()
            t.gpu_free[winner] = picked_gpus(want, before[None, :])[0]
            t.cpu_used[winner] += want.millicpus
            t.mem_used[winner] += want.memory_mb
            t.disk_used[winner] += want.disk_mb
            if self.settings.batch:
                t.app_machines[winner] += 1
            t.version[winner] += 1
            rows.append(winner)
            taken.append(before - t.gpu_free[winner])
        # The claims are undone here and applied again with the group (one path for both).
        for row, gpus in zip(rows, taken, strict=True):
            t.gpu_free[row] += gpus
            t.cpu_used[row] -= want.millicpus
            t.mem_used[row] -= want.memory_mb
            t.disk_used[row] -= want.disk_mb
        t.app_machines[rows] = 0
        if not rows or (self.settings.batch and len(rows) < count):
            return None
        return _Group(
            index,
            np.array(rows, dtype=np.int64),
            np.ones(len(rows), dtype=np.int64),
            taken,
        )

    def _apply(self, group: _Group, want: Resources, sign: int) -> None:
        t, rows, counts = self.table, group.rows, group.counts
        np.add.at(t.cpu_used, rows, sign * counts * want.millicpus)
        np.add.at(t.mem_used, rows, sign * counts * want.memory_mb)
        np.add.at(t.disk_used, rows, sign * counts * want.disk_mb)
        if group.gpus is not None:
            for row, gpus in zip(rows, group.gpus, strict=True):
                t.gpu_free[row] -= sign * gpus
        np.add.at(t.version, rows, 1)
        gpu_milli = want.gpus * GPU_MILLI + want.gpu_milli
        n = sign * int(counts.sum())
        self.measures.changed(rows, n, gpu_milli * n)
        self.window.change(
            self.measures.last, n * want.millicpus, n * want.memory_mb, n * gpu_milli
        )

    def _leave(self, group: _Group) -> None:
        want, _ = self._want(group.task)
        self._apply(group, want, -1)
        for victim_id, row in group.victims.items():
            self.victims.remove(row, victim_id)

    # -- the report ---------------------------------------------------------------------------

    def _report(self) -> FleetReport:
        report = self.measures.report(
            policy=self.pipeline.name,
            settings=self.settings,
            tasks=self.tasks,
            placed=self.placed,
            failed=self.failed,
            ends=self.ends,
            reasons=dict(self.reasons),
        )
        return replace(
            report,
            classes=self.tally.as_json(),
            preempt=self.settings.preempt,
            window_s=(self.window.start, self.window.end),
            window_utilisation=self.window.utilisation(),
        )


def replay_fleet(
    hosts: Sequence[Resources],
    tasks: Sequence[Task],
    *,
    pipeline: Pipeline,
    settings: Settings = DEFAULT_SETTINGS,
) -> FleetReport:
    """Replay ``tasks`` on ``hosts`` through ``pipeline`` (:class:`Fleet`)."""
    return Fleet(hosts, tasks, pipeline=pipeline, settings=settings).run()
