"""The pipeline over columns: the same stages, in the same order, with the same weights and tie
rule, evaluated for every worker at once with numpy.

A broker ranks a handful of sampled offers one by one (:meth:`Pipeline.rank`); the simulator
must score every worker of a 1,000-worker cluster for each of 10,000 placements, as the ATC'23
experiment does. :func:`rank_table` runs a :class:`~souq.placement.pipeline.Pipeline` over an
:class:`OfferTable` (one row per worker, as the book would offer it): each filter gives a mask
and its reasons, each scorer an array (NaN: no opinion), then the weighted mean and the order.
A stage without a column form here runs row by row on :meth:`OfferTable.offer`, so nothing is
skipped, only slower. tests/unit/test_sim_columns.py pins both forms to the same answers.

A :class:`Memo` keeps scorer results per request shape and worker until the worker changes (a
placement changes one worker): the stages are pure functions of the request and the worker.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from souq.model.protocol import Offer
from souq.model.reasons import Reason
from souq.model.resources import GPU_MILLI, Resources
from souq.model.worker import WorkerInfo, WorkerState
from souq.placement import filters, gpu_scorers, gpus, scorers
from souq.placement.pipeline import Pipeline
from souq.placement.request import PlacementRequest
from souq.placement.stages import Filter, Scorer
from souq.sim import gpu_columns
from souq.sim.arrays import Bools, Floats, Ints

__all__ = [
    "Evaluation",
    "Memo",
    "OfferTable",
    "TableRanking",
    "evaluate",
    "rank_table",
    "reason_name",
]


def shape_bits(shapes: dict[str, int]) -> int:
    """The GPU shapes a worker holds as bits (GpuClustering compares them)."""
    return sum(gpu_columns.SHAPE_BITS.get(s, 32) for s, n in shapes.items() if n > 0)


@dataclass
class OfferTable:
    """Workers as columns, rows sorted by worker id (the order ``first`` ties go by)."""

    ids: list[str]
    regions: npt.NDArray[Any]
    states: npt.NDArray[Any]
    cpu_cap: Ints
    cpu_used: Ints
    mem_cap: Ints
    mem_used: Ints
    disk_cap: Ints
    disk_used: Ints
    ngpu: Ints
    gpu_free: Ints  # (n, G): free thousandths per GPU, 0 past a worker's own GPUs
    models: npt.NDArray[Any]
    shapes: Ints  # GPU machine shapes held, as bits
    app_machines: Ints
    version: Ints = field(init=False)
    closed: Bools = field(init=False)  # cordoned or draining: takes no new machines
    only_region: str | None = field(init=False)  # the region, when every row is of one

    def __post_init__(self) -> None:
        self.version = np.zeros(len(self.ids), dtype=np.int64)
        self.closed = np.isin(self.states, _CLOSED)
        regions = set(self.regions.tolist())
        self.only_region = regions.pop() if len(regions) == 1 else None

    @classmethod
    def of(cls, workers: Sequence[WorkerInfo]) -> OfferTable:
        ws = sorted(workers, key=lambda w: w.id)
        width = max([w.capacity.gpus for w in ws] + [1])
        gpu = np.zeros((len(ws), width), dtype=np.int64)
        for i, w in enumerate(ws):
            free = gpus.free_on(w)
            gpu[i, : len(free)] = free

        def ints(values: list[int]) -> Ints:
            return np.array(values, dtype=np.int64)

        return cls(
            ids=[w.id for w in ws],
            regions=np.array([w.region for w in ws], dtype=object),
            states=np.array([str(w.state) for w in ws], dtype=object),
            cpu_cap=ints([w.capacity.millicpus for w in ws]),
            cpu_used=ints([w.allocated.millicpus for w in ws]),
            mem_cap=ints([w.capacity.memory_mb for w in ws]),
            mem_used=ints([w.allocated.memory_mb for w in ws]),
            disk_cap=ints([w.capacity.disk_mb for w in ws]),
            disk_used=ints([w.allocated.disk_mb for w in ws]),
            ngpu=ints([w.capacity.gpus for w in ws]),
            gpu_free=gpu,
            models=np.array([w.capacity.gpu_model or "" for w in ws], dtype=object),
            shapes=ints([shape_bits(w.gpu_shapes) for w in ws]),
            app_machines=np.zeros(len(ws), dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.ids)

    def update(self, i: int, worker: WorkerInfo) -> None:
        """Row ``i`` is now ``worker`` (after a placement or a departure)."""
        self.cpu_used[i] = worker.allocated.millicpus
        self.mem_used[i] = worker.allocated.memory_mb
        self.disk_used[i] = worker.allocated.disk_mb
        free = gpus.free_on(worker)
        self.gpu_free[i, : len(free)] = free
        self.shapes[i] = shape_bits(worker.gpu_shapes)
        self.states[i] = str(worker.state)
        self.closed[i] = self.states[i] in _CLOSED
        self.version[i] += 1

    def after_claims(self, rows: Ints, claims: Ints, want: Resources, app: Ints) -> OfferTable:
        """Rows ``rows`` as they would be after ``claims`` more machines of ``want`` each (no
        GPUs: their choice is the worker's), holding ``app`` machines of the app asking: the
        book as a batch's later claims see it, for all the claims ahead at once."""
        assert not want.wants_gpu, "a GPU claim changes which GPUs are free: claim it row by row"
        out = OfferTable.__new__(OfferTable)
        # Ids only for a stage with no column form (it reads row i's offer): an object array
        # indexes as the list does, at numpy's cost.
        out.ids = cast("list[str]", np.asarray(self.ids, dtype=object)[rows])
        out.regions, out.states = self.regions[rows], self.states[rows]
        out.cpu_cap, out.mem_cap, out.disk_cap = (
            self.cpu_cap[rows],
            self.mem_cap[rows],
            self.disk_cap[rows],
        )
        out.cpu_used = self.cpu_used[rows] + claims * want.millicpus
        out.mem_used = self.mem_used[rows] + claims * want.memory_mb
        out.disk_used = self.disk_used[rows] + claims * want.disk_mb
        out.ngpu, out.gpu_free, out.models = self.ngpu[rows], self.gpu_free[rows], self.models[rows]
        out.shapes, out.app_machines = self.shapes[rows], app
        out.version, out.closed = self.version[rows], self.closed[rows]
        out.only_region = self.only_region
        return out

    def offer(self, i: int) -> Offer:
        """Row ``i`` as the offer the row-by-row pipeline reads."""
        n = int(self.ngpu[i])
        capacity = Resources(
            cpus=int(self.cpu_cap[i]) / 1000,
            memory_mb=int(self.mem_cap[i]),
            disk_mb=int(self.disk_cap[i]),
            gpus=n,
            gpu_model=str(self.models[i]) or None,
        )
        used = Resources(
            cpus=int(self.cpu_used[i]) / 1000,
            memory_mb=int(self.mem_used[i]),
            disk_mb=int(self.disk_used[i]),
        )
        bits = int(self.shapes[i])
        worker = WorkerInfo(
            id=self.ids[i],
            region=str(self.regions[i]),
            state=WorkerState(str(self.states[i])),
            capacity=capacity,
            allocated=used,
            gpu_free=[int(f) for f in self.gpu_free[i, :n]],
            gpu_shapes={s: 1 for s, b in gpu_columns.SHAPE_BITS.items() if bits & b},
        )
        return Offer(worker=worker, eligible=True, app_machines=int(self.app_machines[i]))


@dataclass(frozen=True)
class TableRanking:
    """The feasible rows best first, their final scores, and the rejections by reason."""

    ordered: Ints
    scores: Floats
    rejections: dict[str, int]

    @property
    def winner(self) -> int | None:
        return int(self.ordered[0]) if len(self.ordered) else None


@dataclass
class Memo:
    """Scorer results by (scorer, request shape): values for every row and the row versions
    they were computed at."""

    size: int
    kept: dict[tuple[str, str], tuple[Floats, Ints]] = field(default_factory=dict)

    def scores(
        self, key: tuple[str, str], table: OfferTable, rows: Ints, compute: Callable[[Ints], Floats]
    ) -> Floats:
        if key not in self.kept:
            self.kept[key] = (np.zeros(self.size), np.full(self.size, -1, dtype=np.int64))
        values, seen = self.kept[key]
        stale = rows[seen[rows] != table.version[rows]]
        if len(stale):
            values[stale] = compute(stale)
            seen[stale] = table.version[stale]
        return values[rows]


# -- filters -----------------------------------------------------------------------------------

Verdict = tuple[Bools, Ints]  # (passes, the code of the reason where it does not)
_NO_REASON: Ints = np.zeros(0, dtype=np.int64)  # with a mask that passes every row
# The states of a worker that takes no new machines (cordoned; draining too).
_CLOSED = [str(WorkerState.CORDONED), str(WorkerState.DRAINING)]
_REASONS: list[str] = [""]  # reasons by code (0: none), counted with bincount
_CODES: dict[str, int] = {"": 0}


def _code(reason: str) -> int:
    code = _CODES.get(reason)
    if code is None:
        code = _CODES[reason] = len(_REASONS)
        _REASONS.append(reason)
    return code


def _reasons(n: int) -> Ints:
    return np.zeros(n, dtype=np.int64)


def _gpu_verdict(want: Resources, t: OfferTable, rows: Ints) -> Verdict:
    n = len(rows)
    ok = np.ones(n, dtype=bool)
    reason = _reasons(n)
    if not want.wants_gpu:
        return ok, reason
    free = t.gpu_free[rows]
    if want.gpu_model is not None:
        bad = t.models[rows] != want.gpu_model
        ok &= ~bad
        reason[bad] = _code(Reason.WRONG_GPU_MODEL)
    if want.gpus > 0:
        short = (free >= GPU_MILLI).sum(axis=1) < want.gpus
        code = Reason.INSUFFICIENT_GPUS
    else:
        short = free.max(axis=1) < want.gpu_milli
        code = Reason.INSUFFICIENT_GPU_SHARE
    reason[ok & short] = _code(code)
    return ok & ~short, reason


def _resources_verdict(want: Resources, t: OfferTable, rows: Ints) -> Verdict:
    n = len(rows)
    ok = np.ones(n, dtype=bool)
    reason = _reasons(n)
    for code, need, cap, used in (
        (Reason.INSUFFICIENT_CPU, want.millicpus, t.cpu_cap, t.cpu_used),
        (Reason.INSUFFICIENT_MEMORY, want.memory_mb, t.mem_cap, t.mem_used),
        (Reason.INSUFFICIENT_DISK, want.disk_mb, t.disk_cap, t.disk_used),
    ):
        short = ok & (cap[rows] - used[rows] < need)
        reason[short] = _code(code)
        ok &= ~short
    gpu_ok, gpu_reason = _gpu_verdict(want, t, rows)
    reason[ok & ~gpu_ok] = gpu_reason[ok & ~gpu_ok]
    return ok & gpu_ok, reason


def _state(f: Filter, request: PlacementRequest, t: OfferTable, rows: Ints) -> Verdict | None:
    if not t.closed.any():
        return None  # every worker takes machines: all pass
    out = t.closed[rows]
    draining = t.states[rows] == str(WorkerState.DRAINING)
    closed = np.where(draining, _code(Reason.DRAINING), _code(Reason.CORDONED))
    return ~out, np.where(out, closed, 0)


def _region(f: Filter, request: PlacementRequest, t: OfferTable, rows: Ints) -> Verdict | None:
    if t.only_region == request.region:
        return None  # one region, the one asked for: all pass
    wrong = t.regions[rows] != request.region
    return ~wrong, np.where(wrong, _code(Reason.WRONG_REGION), 0)


def _passes(f: Filter, request: PlacementRequest, t: OfferTable, rows: Ints) -> Verdict | None:
    """All pass where the request asks nothing of the filter (None: ask row by row)."""
    asks = {
        filters.ConstraintFilter: bool(request.constraints),
        filters.DistinctWorkersFilter: request.distinct_workers_for == "app",
        filters.StandbyFilter: bool(request.avoid_workers),
        filters.VolumeFilter: request.volume_worker is not None or bool(request.volume_avoid),
    }.get(type(f), False)  # a table's workers state no drivers and decline nothing themselves
    return None if asks else _all(rows)


def _all(rows: Ints) -> Verdict:
    """Every row passes."""
    return np.ones(len(rows), dtype=bool), _NO_REASON


_FILTERS: dict[type, Callable[[Any, PlacementRequest, OfferTable, Ints], Verdict | None]] = {
    filters.StateFilter: lambda f, r, t, rows: _state(f, r, t, rows) or _all(rows),
    filters.RegionFilter: lambda f, r, t, rows: _region(f, r, t, rows) or _all(rows),
    filters.DriverFilter: _passes,
    filters.EligibleFilter: _passes,
    filters.ConstraintFilter: _passes,
    filters.DistinctWorkersFilter: _passes,
    filters.StandbyFilter: _passes,
    filters.VolumeFilter: _passes,
    filters.GpuFilter: lambda f, r, t, rows: _gpu_verdict(r.resources, t, rows),
    filters.ResourcesFilter: lambda f, r, t, rows: _resources_verdict(r.resources, t, rows),
}


def _filter_verdict(f: Filter, request: PlacementRequest, t: OfferTable, rows: Ints) -> Verdict:
    column = _FILTERS.get(type(f))
    verdict = None if column is None else column(f, request, t, rows)
    if verdict is not None:
        return verdict
    ok = np.ones(len(rows), dtype=bool)
    reason = _reasons(len(rows))
    for k, i in enumerate(rows):
        rejection = f.check(request, t.offer(int(i)))
        if rejection is not None:
            ok[k], reason[k] = False, _code(rejection.reason)
    return ok, reason


# -- scorers -----------------------------------------------------------------------------------


def _curve(points: tuple[tuple[float, float], ...], x: Floats) -> Floats:
    return np.interp(x, [p[0] for p in points], [p[1] for p in points])


def _after(want: Resources, t: OfferTable, rows: Ints) -> tuple[Floats, Floats]:
    def ratio(used: Ints, cap: Ints, need: int) -> Floats:
        u = (used[rows] + need).astype(np.float64)
        c = cap[rows].astype(np.float64)
        r = np.divide(u, c, out=np.where(u > 0, 1.0, 0.0), where=c > 0)
        return np.clip(r, 0.0, 1.0)

    return (
        ratio(t.cpu_used, t.cpu_cap, want.millicpus),
        ratio(t.mem_used, t.mem_cap, want.memory_mb),
    )


def _fgd(s: gpu_scorers.FgdScorer, want: Resources, t: OfferTable, rows: Ints) -> Floats:
    none = np.nan if s.gpu_workers_only else 0.0
    if not (t.ngpu[rows] > 0).any():
        return np.full(len(rows), none)  # no GPU worker among them: nothing to fragment
    cpus = t.cpu_cap[rows] - t.cpu_used[rows]
    free, models = t.gpu_free[rows], t.models[rows]
    left = gpu_columns.picked(want, free)
    before = gpu_columns.frag(s.workload, cpus, free, models)
    after = gpu_columns.frag(s.workload, cpus - want.millicpus, left, models)
    if s.cpu_per_gpu > 0:
        before += gpu_columns.stranded(cpus, free.sum(axis=1), s.cpu_per_gpu)
        after += gpu_columns.stranded(cpus - want.millicpus, left.sum(axis=1), s.cpu_per_gpu)
    delta = np.clip(-(before - after) / 1000, -700.0, 700.0)
    out = np.floor(100.0 / (1.0 + np.exp(delta))) / 100
    return np.where(t.ngpu[rows] > 0, out, none)


def _best_fit(s: scorers.BestFitScorer, r: PlacementRequest, t: OfferTable, rows: Ints) -> Floats:
    cpu, mem = _after(r.resources, t, rows)
    out = (_curve(s.cpu_curve.points, cpu) + _curve(s.memory_curve.points, mem)) / 2
    return np.where(t.ngpu[rows] > 0, np.nan, out) if s.skip_gpu_workers else out


def _binpack(s: Scorer, r: PlacementRequest, t: OfferTable, rows: Ints) -> Floats:
    cpu, mem = _after(r.resources, t, rows)
    fitness = 20.0 - (10.0 ** (1.0 - cpu) + 10.0 ** (1.0 - mem))
    return np.clip(fitness / scorers.NOMAD_MAX_FIT, 0.0, 1.0)


def _spread(s: Scorer, r: PlacementRequest, t: OfferTable, rows: Ints) -> Floats:
    cpu, mem = _after(r.resources, t, rows)
    return 1.0 - (cpu + mem) / 2


def _anti_affinity(s: Scorer, r: PlacementRequest, t: OfferTable, rows: Ints) -> Floats | None:
    return 1.0 / (1 + np.maximum(t.app_machines[rows], 0))


def _unmeasured(s: Scorer, r: PlacementRequest, t: OfferTable, rows: Ints) -> Floats | None:
    """A table's workers measure no load and cache no image: no opinion (an image: row by
    row)."""
    return np.full(len(rows), np.nan) if r.image is None else None


def _free_columns(r: PlacementRequest, t: OfferTable, rows: Ints) -> tuple[Ints, Ints, int]:
    want = r.resources
    return (
        t.cpu_cap[rows] - t.cpu_used[rows],
        t.gpu_free[rows],
        want.gpus * GPU_MILLI + want.gpu_milli,
    )


def _leftover(
    s: gpu_scorers.LeftoverScorer, r: PlacementRequest, t: OfferTable, rows: Ints
) -> Floats:
    cpu_free, free, asked = _free_columns(r, t, rows)
    left = (
        0.5 * (cpu_free - r.resources.millicpus) / s.max_cpu
        + 0.5 * (free.sum(axis=1) - asked) / s.max_gpu
    )
    return gpu_columns.points(((1.0 - left) * 100).astype(np.int64))


def _dotprod(
    s: gpu_scorers.DotProdScorer, r: PlacementRequest, t: OfferTable, rows: Ints
) -> Floats:
    cpu_free, free, asked = _free_columns(r, t, rows)
    dot = (cpu_free / s.max_cpu) * (r.resources.millicpus / s.max_cpu) + (
        free.sum(axis=1) / s.max_gpu
    ) * (asked / s.max_gpu)
    return gpu_columns.points(np.floor(100 * (1 - dot / 2)))


_SCORERS: dict[type, Callable[[Any, PlacementRequest, OfferTable, Ints], Floats | None]] = {
    scorers.BestFitScorer: _best_fit,
    scorers.BinPackScorer: _binpack,
    scorers.SpreadScorer: _spread,
    scorers.AntiAffinityScorer: _anti_affinity,
    scorers.LoadScorer: _unmeasured,
    scorers.CacheScorer: _unmeasured,
    gpu_scorers.FgdScorer: lambda s, r, t, rows: _fgd(s, r.resources, t, rows),
    gpu_scorers.LeftoverScorer: _leftover,
    gpu_scorers.DotProdScorer: _dotprod,
    gpu_scorers.GpuPackingScorer: lambda s, r, t, rows: gpu_columns.gpupacking(
        r.resources, t.gpu_free[rows], t.ngpu[rows]
    ),
    gpu_scorers.GpuClusteringScorer: lambda s, r, t, rows: gpu_columns.gpuclustering(
        s, r.resources, t.gpu_free[rows], t.shapes[rows]
    ),
}


def _score(s: Scorer, request: PlacementRequest, t: OfferTable, rows: Ints) -> Floats:
    column = _SCORERS.get(type(s))
    values = None if column is None else column(s, request, t, rows)
    if values is not None:
        return values
    return np.array(
        [np.nan if (v := s.score(request, t.offer(int(i)))) is None else v for i in rows]
    )


# -- the pipeline ------------------------------------------------------------------------------


def _shape_key(request: PlacementRequest) -> str:
    r = request.resources
    return f"{r.millicpus}/{r.memory_mb}/{r.disk_mb}/{r.gpus}/{r.gpu_milli}/{r.gpu_model}"


def rank_table(
    pipeline: Pipeline,
    request: PlacementRequest,
    table: OfferTable,
    *,
    memo: Memo | None = None,
    rng: np.random.Generator | None = None,
) -> TableRanking:
    """:meth:`Pipeline.rank` over every row of ``table``: the feasible rows best first. Ties go
    to the smallest id when the pipeline says ``first`` (the table's order), else to a random
    order (``rng``; seeded from the request id when not given)."""
    rows = np.arange(len(table), dtype=np.int64)
    counts: Counter[str] = Counter()
    for f in pipeline.filters:
        ok, reason = _filter_verdict(f, request, table, rows)
        if reason is not _NO_REASON and not ok.all():
            for code, n in enumerate(np.bincount(reason[~ok])):
                if n:
                    counts[_REASONS[code]] += int(n)
            rows = rows[ok]
        if not len(rows):
            return TableRanking(rows, np.zeros(0), dict(counts))
    first = pipeline.first_wins(request, bool((table.ngpu[rows] > 0).any()))
    if not first or pipeline.limit is not None:
        gen = rng or np.random.default_rng(random.Random(request.request_id).getrandbits(64))
        rows = rows[gen.permutation(len(rows))]
        if pipeline.limit is not None:
            counts["not_sampled"] += max(0, len(rows) - pipeline.limit)
            rows = rows[: pipeline.limit]
        if first:
            rows = np.sort(rows)
    final = _weighted(pipeline, request, table, rows, memo)
    best = np.argsort(-final, kind="stable")
    return TableRanking(rows[best], final[best], dict(counts))


def _weighted(
    pipeline: Pipeline, request: PlacementRequest, table: OfferTable, rows: Ints, memo: Memo | None
) -> Floats:
    """The pipeline's final score of each row: its scorers' weighted mean (0 with no opinion)."""
    total = np.zeros(len(rows))
    weight = np.zeros(len(rows))
    key = _shape_key(request)
    for s in pipeline.scorers:
        if memo is not None and isinstance(s, gpu_scorers.FgdScorer):
            values = memo.scores(
                (s.name, key), table, rows, functools.partial(_score, s, request, table)
            )
        else:
            values = _score(s, request, table, rows)
        has = ~np.isnan(values)
        total += np.where(has, values, 0.0) * s.weight
        weight += has * s.weight
    return np.divide(total, weight, out=np.zeros(len(rows)), where=weight > 0)


@dataclass(frozen=True)
class Evaluation:
    """Every row of a table judged for one request: whether it passes the filters, the code of
    the first filter's reason where it does not (:func:`reason_name`), and its final score
    (``-inf`` where it does not pass). No sample and no order: the caller picks."""

    ok: Bools
    reason: Ints
    score: Floats


def reason_name(code: int) -> str:
    """The rejection reason an :class:`Evaluation` codes as ``code`` (0: none)."""
    return _REASONS[code]


def evaluate(pipeline: Pipeline, request: PlacementRequest, table: OfferTable) -> Evaluation:
    """:meth:`Pipeline.rank`'s filters and scorers over every row of ``table``, each row
    judged on its own (the stages are pure functions of the request and the row)."""
    n = len(table)
    rows = np.arange(n, dtype=np.int64)
    reason = np.zeros(n, dtype=np.int64)
    for f in pipeline.filters:
        ok, why = _filter_verdict(f, request, table, rows)
        if why is not _NO_REASON and not ok.all():
            reason[rows[~ok]] = why[~ok]
            rows = rows[ok]
        if not len(rows):
            break
    passed = np.zeros(n, dtype=bool)
    passed[rows] = True
    score = np.full(n, -np.inf)
    if len(rows):
        score[rows] = _weighted(pipeline, request, table, rows, None)
    return Evaluation(passed, reason, score)
