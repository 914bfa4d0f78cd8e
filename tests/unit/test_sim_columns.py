"""The pipeline over columns (the simulator's) gives the answers of the pipeline a broker runs
offer by offer: the same feasible workers, the same rejections, the same scores, and under the
``first`` tie rule the same order."""

from __future__ import annotations

import random

import pytest

from souq.model.policy import FIT_SCORERS, PlacementDefaults, PlacementPolicy
from souq.model.resources import Resources
from souq.model.worker import WorkerInfo, WorkerState
from souq.placement import PlacementRequest, build_pipeline
from souq.placement.fragmentation import Shape
from souq.sim.columns import Memo, OfferTable, rank_table

MODELS = ("A100", "T4")
WORKLOAD = (
    Shape(4000, 1000, 1, p=0.5),
    Shape(2000, 500, 1, p=0.3),
    Shape(16000, 1000, 4, p=0.1),
    Shape(8000, 0, 0, p=0.1),
)


def _worker(rng: random.Random, i: int) -> WorkerInfo:
    ngpu = rng.choice((0, 0, 1, 2, 4, 8))
    cpus = rng.choice((8, 16, 32, 64))
    mem = rng.choice((16384, 65536))
    free = [rng.choice((1000, 1000, 0, 190, 530, 810, 500)) for _ in range(ngpu)]
    used_gpu = Resources(cpus=0, memory_mb=0, gpu_milli=sum(1000 - f for f in free))
    allocated = Resources(
        cpus=rng.randint(0, cpus * 1000) / 1000, memory_mb=rng.randint(0, mem)
    ).plus(used_gpu)
    return WorkerInfo(
        id=f"w{i:03d}",
        region=rng.choice(("ams", "ams", "ams", "fra")),
        state=rng.choice((WorkerState.UP,) * 8 + (WorkerState.CORDONED, WorkerState.DRAINING)),
        capacity=Resources(
            cpus=cpus, memory_mb=mem, gpus=ngpu, gpu_model=rng.choice(MODELS) if ngpu else None
        ),
        allocated=allocated,
        gpu_free=free,
        gpu_shapes={rng.choice(("share", "1", "2")): 1} if ngpu and rng.random() < 0.6 else {},
    )


def _request(rng: random.Random, k: int) -> PlacementRequest:
    kind = rng.choice(("cpu", "share", "whole", "model"))
    gpus = rng.choice((1, 2, 4)) if kind in ("whole", "model") else 0
    return PlacementRequest(
        request_id=f"r{k}",
        app="a",
        region="ams",
        resources=Resources(
            cpus=rng.choice((0.5, 2, 4, 11)),
            memory_mb=rng.choice((512, 4096)),
            gpus=gpus,
            gpu_milli=rng.choice((160, 470, 810)) if kind == "share" else 0,
            gpu_model=rng.choice(MODELS) if kind == "model" else None,
        ),
    )


@pytest.mark.parametrize("policy", [*FIT_SCORERS, "random"])
def test_columns_rank_as_the_broker_does(policy: str) -> None:
    rng = random.Random(policy)
    workers = [_worker(rng, i) for i in range(60)]
    table = OfferTable.of(workers)
    offers = [table.offer(i) for i in range(len(table))]
    pipeline = build_pipeline(
        PlacementPolicy(policy=policy),  # type: ignore[arg-type]
        PlacementDefaults(),
        workload=WORKLOAD,
    )
    memo = Memo(len(table))
    for k in range(40):
        request = _request(rng, k)
        row = pipeline.rank(request, offers)
        col = rank_table(pipeline, request, table, memo=memo)
        assert col.rejections == row.rejections
        by_id = {o.worker_id: o.score or 0.0 for o in row.outcomes if o.rejected is None}
        assert {table.ids[i] for i in col.ordered} == set(by_id)
        for i, score in zip(col.ordered, col.scores, strict=True):
            assert score == pytest.approx(by_id[table.ids[i]], abs=1e-6)
        if pipeline.first_wins(request, any(w.capacity.gpus for w in workers)):
            assert [table.ids[i] for i in col.ordered] == [o.worker.id for o in row.ordered]
        elif row.ordered:
            assert col.scores[0] == pytest.approx(max(by_id.values()), abs=1e-6)


def test_a_changed_row_is_scored_again() -> None:
    rng = random.Random(7)
    workers = [_worker(rng, i) for i in range(30)]
    table = OfferTable.of(workers)
    pipeline = build_pipeline(PlacementPolicy(policy="fgd"), PlacementDefaults(), workload=WORKLOAD)
    memo = Memo(len(table))
    request = PlacementRequest(
        request_id="r", app="a", region="ams", resources=Resources(cpus=1, memory_mb=64, gpus=1)
    )
    first = rank_table(pipeline, request, table, memo=memo).winner
    assert first is not None
    # Fill the winner's GPUs: the memo must not keep its old score.
    w = workers[first]
    table.update(first, w.model_copy(update={"gpu_free": [0] * w.capacity.gpus}))
    fresh = rank_table(pipeline, request, table, memo=memo)
    plain = rank_table(pipeline, request, table)
    assert first not in fresh.ordered
    assert list(fresh.ordered) == list(plain.ordered)
