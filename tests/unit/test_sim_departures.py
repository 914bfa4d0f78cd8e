"""Replaying a trace with departures on virtual time, through the real placement pipeline:
small traces whose outcome is known exactly, and the measures of the report."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from bench.openb import NODES, PODS

from souq.errors import InvalidInput
from souq.model.policy import PlacementDefaults, PlacementPolicy
from souq.model.resources import Resources
from souq.placement import build_pipeline
from souq.sim.departures import (
    Outcome,
    Replay,
    parse_workers,
    percentile,
    replay,
    request_of,
    speed_up,
    workers_of,
)
from souq.sim.traces import Task, parse_tasks, read_nodes, read_pods, tasks_from_pods

needs_traces = pytest.mark.skipif(not PODS.exists(), reason="the openb trace is not here")


def task(
    name: str,
    at: float,
    duration: float | None,
    cpus: float = 1,
    memory_mib: int = 256,
    num_gpu: int = 0,
    gpu_milli: int = 0,
    spec: tuple[str, ...] = (),
) -> Task:
    return Task(name, at, duration, int(cpus * 1000), memory_mib, num_gpu, gpu_milli, spec)


def where(outcomes: list[Outcome]) -> dict[str, str | None]:
    """Each task's worker, or the reason it failed."""
    return {o.task: o.worker or o.reason for o in outcomes}


def test_a_task_that_leaves_frees_room_for_a_later_one() -> None:
    workers = parse_workers("1x4/4G")
    stays = [task("a", 0, None, cpus=4), task("b", 20, 5, cpus=4)]
    leaves = [task("a", 0, 10, cpus=4), task("b", 20, 5, cpus=4)]
    full = replay(workers, stays)
    assert (full.placed, full.failed_by_reason) == (1, {"insufficient_cpu": 1})
    assert where(full.outcomes) == {"a": "w00001", "b": "insufficient_cpu"}
    freed = replay(workers, leaves)
    assert (freed.placed, freed.failed) == (2, 0)
    # a placed, a gone, b placed, b gone: the cluster is empty at the end.
    assert [s.running for s in freed.samples] == [1, 0, 1, 0]
    assert [s.cpu for s in freed.samples] == [100, 0, 100, 0]
    assert freed.samples[1].t == pytest.approx(10)


def test_shares_pack_onto_one_gpu_and_leave_the_other_whole() -> None:
    run = Replay(
        parse_workers("1x16/16G/2:T4"),
        [
            task("s1", 0, None, num_gpu=1, gpu_milli=500),
            task("s2", 1, None, num_gpu=1, gpu_milli=500),
            task("whole", 2, None, num_gpu=1, gpu_milli=1000),
            task("one-more", 3, None, num_gpu=1, gpu_milli=1000),
            task("share", 4, None, num_gpu=1, gpu_milli=100),
        ],
        pipeline=build_pipeline(None, PlacementDefaults()),
    )
    report = run.run()
    (worker,) = run.cluster.workers.values()
    assert sorted(worker.gpu_ids.values()) == [(0,), (0,), (1,)]  # both shares on GPU 0
    assert worker.admission.gpu_free() == (0, 0)
    assert report.failed_by_reason == {"insufficient_gpus": 1, "insufficient_gpu_share": 1}
    assert [s.gpu for s in report.samples] == [25, 50, 100, 100, 100]


def test_failures_are_counted_by_the_reason_their_record_gives() -> None:
    tasks = [
        task("cpu", 0, None, cpus=8),
        task("memory", 1, None, memory_mib=64 * 1024),
        task("model", 2, None, num_gpu=1, gpu_milli=1000, spec=("A100",)),
        task("models", 3, None, num_gpu=1, gpu_milli=1000, spec=("A100", "H100")),
        task("either", 4, None, num_gpu=1, gpu_milli=1000, spec=("A100", "T4")),
        task("fits", 5, None, num_gpu=1, gpu_milli=300, spec=("T4",)),
    ]
    report = replay(parse_workers("3x4/8G/1:T4"), tasks)
    assert report.failed_by_reason == {
        "insufficient_cpu": 1,
        "insufficient_memory": 1,
        "wrong_gpu_model": 1,
        "constraint": 1,  # several models: a constraint on the workers' gpu_model label
    }
    assert report.placed == 2 and report.failed == 4
    outcome = where(report.outcomes)
    assert outcome["model"] == "wrong_gpu_model" and outcome["either"] is not None


def test_a_failure_is_named_by_the_workers_that_came_closest() -> None:
    # Five workers without GPUs say wrong_gpu_model; the one T4 worker, full, says why.
    gpu = [task(f"g{i}", i, None, num_gpu=1, gpu_milli=1000, spec=("T4",)) for i in range(2)]
    report = replay(parse_workers("5x4/4G+1x4/4G/1:T4"), gpu)
    (failed,) = [o for o in report.outcomes if o.reason]
    assert failed.reason == "insufficient_gpus" and report.placed == 1


def test_a_task_asks_what_its_columns_say() -> None:
    share = request_of(task("s", 0, None, cpus=0.5, memory_mib=100, num_gpu=1, gpu_milli=250))
    assert share == (Resources(cpus=0.5, memory_mb=100, gpu_milli=250), ())
    whole, _ = request_of(task("w", 0, None, num_gpu=4, gpu_milli=1000, spec=("V100M32",)))
    assert (whole.gpus, whole.gpu_milli, whole.gpu_model) == (4, 0, "V100M32")
    one, _ = request_of(task("o", 0, None, num_gpu=1, gpu_milli=1000))
    assert (one.gpus, one.gpu_milli) == (1, 0)
    _, constraints = request_of(task("m", 0, None, num_gpu=1, gpu_milli=1000, spec=("A", "B")))
    assert [str(c) for c in constraints] == ["label.gpu_model in [A, B]"]


def test_the_p95_of_the_workers_cpu_is_the_nearest_rank() -> None:
    assert percentile(np.arange(1, 101, dtype=float), 95) == 95
    assert percentile(np.arange(1, 101, dtype=float), 50) == 50
    assert percentile(np.array([7.0]), 95) == 7
    assert percentile(np.array([], dtype=float), 95) == 0
    # 20 workers; each task fills one. One hot worker of 20 is above the p95, two are not.
    report = replay(parse_workers("20x4/4G"), [task(f"t{i}", i, None, cpus=4) for i in range(3)])
    (one, two, three) = report.samples
    assert (one.worker_cpu_p50, one.worker_cpu_p95, one.worker_cpu_max) == (0, 0, 100)
    assert (two.worker_cpu_p95, two.worker_cpu_max, two.cpu) == (100, 100, 10)
    assert three.worker_cpu_p50 == 0 and three.running == 3


def test_the_policy_decides_the_hot_spots() -> None:
    tasks = [task(f"t{i}", i, None, cpus=1) for i in range(4)]
    workers = parse_workers("4x4/4G")
    packed = replay(workers, tasks, policy=PlacementPolicy(policy="binpack"))
    spread = replay(workers, tasks, pipeline=build_pipeline(
        PlacementPolicy(policy="spread"), PlacementDefaults()
    ))  # fmt: skip
    assert (packed.policy, spread.policy) == ("binpack", "spread")
    assert len({o.worker for o in packed.outcomes}) == 1
    assert packed.samples[-1].worker_cpu_max == 100
    assert len({o.worker for o in spread.outcomes}) == 4
    assert spread.samples[-1].worker_cpu_max == 25
    assert packed.summary()["worker_cpu_max_mean"] > spread.summary()["worker_cpu_max_mean"]


def test_samples_on_a_grid_of_virtual_seconds() -> None:
    tasks = [task("a", 0, 25, cpus=2), task("b", 12, 100, cpus=1)]
    report = replay(parse_workers("1x4/4G"), tasks, sample_every_s=10)
    # Through the departures: past b's end at 112.
    assert [s.t for s in report.samples] == list(range(0, 130, 10))
    # At 0 the timer comes before the arrival; at 20 both run; from 25 b alone.
    assert [s.cpu for s in report.samples] == [0, 50, 75] + [25] * 9 + [0]
    with pytest.raises(InvalidInput):
        replay(parse_workers("1x4/4G"), tasks, sample_every_s=0)


def test_a_generic_trace_replays_and_reports_as_json() -> None:
    text = (
        "name,arrival_s,duration_s,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "a,0,30,2000,1024,1,500,T4\n"
        "b,10,,2000,1024,0,0,\n"
        "c,20,5,2000,1024,0,0,\n"
    )
    report = replay(parse_workers("2x4/4G/1:T4"), parse_tasks(text))
    body = report.as_json()
    assert {k: body[k] for k in ("workers", "tasks", "placed", "failed")} == {
        "workers": 2,
        "tasks": 3,
        "placed": 3,
        "failed": 0,
    }
    assert body["policy"] == "best-fit" and len(body["samples"]) == 5
    assert "samples" not in report.as_json(samples=False)


def test_workers_come_from_a_spec_or_a_node_list() -> None:
    workers = parse_workers("2x32/128G + 1x96/786432/8:V100M32")
    assert len(workers) == 3
    assert workers[0] == Resources(cpus=32, memory_mb=128 * 1024)
    assert (workers[2].gpus, workers[2].gpu_model, workers[2].memory_mb) == (8, "V100M32", 786432)
    assert parse_workers("4/512") == [Resources(cpus=4, memory_mb=512)]
    for bad in ("lots", "2x/4G", "0x4/4G", "2x4/4G/x"):
        with pytest.raises(InvalidInput, match="workers") as err:
            parse_workers(bad)
        assert err.value.details == {"field": "workers"}
    with pytest.raises(InvalidInput, match="at least one worker"):
        replay([], [])
    with pytest.raises(InvalidInput, match="speed-up"):
        speed_up([], 0)


@needs_traces
def test_the_openb_trace_replays_with_its_departures() -> None:
    nodes = read_nodes(NODES)
    tasks = speed_up(tasks_from_pods(read_pods(PODS)), 300)[:2000]
    report = replay(workers_of(nodes), tasks, sample_every_s=3600)
    assert report.workers == len(nodes) and report.tasks == 2000
    assert report.placed + report.failed == 2000 and report.placed > 1900
    assert all(0 <= s.worker_cpu_p95 <= s.worker_cpu_max <= 100 for s in report.samples)


def test_a_gpu_policy_replays_against_the_traces_own_tasks() -> None:
    tasks = [task(f"s{i}", i, 50, num_gpu=1, gpu_milli=250 * (1 + i % 3)) for i in range(12)]
    tasks.append(task("whole", 20, None, num_gpu=2, gpu_milli=1000))
    workers = parse_workers("3x8/8G/2:T4")
    for name in ("fgd", "gpupacking", "leftover"):
        report = replay(workers, tasks, policy=PlacementPolicy.model_validate({"policy": name}))
        assert report.policy == name and report.placed + report.failed == 13


def test_a_burst_one_by_one_is_ranked_against_the_book_each_claim_charged() -> None:
    # Eight instances arriving in the same second, one create each, spread over four workers:
    # against the book as it was before the burst, every create would rank the same empty
    # workers first and pile the eight onto three of them.
    burst = [replace(task("burst", 5, 60, cpus=1), instances=8)]
    spread = build_pipeline(PlacementPolicy(policy="spread"), PlacementDefaults())
    report = replay(parse_workers("4x32/64G"), burst, pipeline=spread, batch=False)
    assert report.placed == 8
    per_worker = Counter(o.worker for o in report.outcomes)
    assert sorted(per_worker.values()) == [2, 2, 2, 2]
    # Best-fit onto workers of room for two each: the burst fills them two by two, every
    # instance placed (against the stale book the first worker is sent all eight).
    fit = build_pipeline(PlacementPolicy(policy="best-fit"), PlacementDefaults())
    report = replay(parse_workers("4x2/4G"), burst, pipeline=fit, batch=False)
    assert report.placed == 8
    assert sorted(Counter(o.worker for o in report.outcomes).values()) == [2, 2, 2, 2]


def test_hot_spots_are_told_per_resource_over_worker_time() -> None:
    # A memory-bound workload: each task takes 15 of a worker's 16 GiB and one of its 16 cpus.
    tasks = [task("a", 0, 100, cpus=1, memory_mib=15 * 1024), task("b", 0, 100, cpus=1,
             memory_mib=15 * 1024)]  # fmt: skip
    spread = build_pipeline(PlacementPolicy(policy="spread"), PlacementDefaults())
    report = replay(parse_workers("2x16/16G"), tasks, pipeline=spread)
    assert report.placed == 2
    assert set(report.hot) == {"cpu", "memory"}  # no GPU figure without GPUs
    assert report.hot["cpu"] == 0
    assert report.hot["memory"] == pytest.approx(100, abs=0.01)  # from its placement on
    hosts = report.host_utilisation
    assert hosts["memory_p95"] == hosts["memory_max"] == pytest.approx(93.75, abs=0.01)
    assert hosts["cpu_max"] == pytest.approx(6.25, abs=0.01)
    assert report.as_json(samples=False)["hot"] == report.hot
    # Above a threshold of 0.95 nothing is hot; with b gone at 50 s, 150 of 200 worker-seconds.
    cool = replay(parse_workers("2x16/16G"), tasks, pipeline=spread, hot=0.95)
    assert cool.hot == {"cpu": 0, "memory": 0}
    half = replay(parse_workers("2x16/16G"), [tasks[0], replace(tasks[1], duration_s=50)],
                  pipeline=spread)  # fmt: skip
    assert half.hot["memory"] == pytest.approx(75, abs=0.01)
    # GPUs where the workers have them, over the GPU workers only.
    gpu = replay(parse_workers("1x8/8G/2+1x8/8G"), [task("g", 0, 10, num_gpu=2)])
    assert gpu.hot["gpu"] == pytest.approx(100, abs=0.1)
    assert gpu.host_utilisation["gpu_max"] == pytest.approx(100, abs=0.1)
    with pytest.raises(InvalidInput):
        replay(parse_workers("2x16/16G"), tasks, hot=1.5)
