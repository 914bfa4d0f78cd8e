"""The ATC'23 experiment through Souq's pipeline and workers' admission: the paper's baselines
place pod for pod as the reference replay does; Souq's default does not make hot spots of
CPU-only workers."""

from __future__ import annotations

import dataclasses

import pytest
from bench.openb import NODES, PODS

from souq.errors import InvalidInput
from souq.sim.market_replay import cpu_utilisation, replay_through_pipeline
from souq.sim.replay import replay
from souq.sim.traces import Node, Pod, read_nodes, read_pods

needs_traces = pytest.mark.skipif(not PODS.exists(), reason="the openb trace is not here")


def _cluster() -> tuple[list[Node], list[Pod]]:
    # The largest node has 128 cores and 8 GPUs, what the paper's fit scores divide by.
    cpus = [32_000, 32_000, 16_000, 128_000, 8_000, 32_000]
    nodes = [
        Node(f"n{i}", c, 128_000, g, "T4")
        for i, (c, g) in enumerate(zip(cpus, [2, 4, 0, 8, 1, 2], strict=True))
    ]
    pods = [Pod(f"p{i}", 2000 + 500 * (i % 3), 1000, 1, 160 * (1 + i % 6)) for i in range(60)]
    pods += [Pod(f"w{i}", 4000, 1000, 1 + i % 2, 1000) for i in range(12)]
    pods += [Pod("big", 4000, 1000, 4, 1000), Pod("cpu", 9000, 1000, 0, 0)]
    return nodes, pods


@pytest.mark.parametrize("policy", ["dotprod", "gpuclustering", "gpupacking", "bestfit"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_baselines_place_as_the_reference_does(policy: str, seed: int) -> None:
    nodes, pods = _cluster()
    ours = replay_through_pipeline(nodes, pods, policy, seed=seed)
    reference = replay(nodes, pods, policy, seed=seed)  # type: ignore[arg-type]
    assert ours.placed + ours.failed >= len(pods)
    assert dataclasses.replace(ours, policy=policy) == reference


def test_unknown_policies_and_several_models_are_refused() -> None:
    nodes, pods = _cluster()
    with pytest.raises(InvalidInput, match="unknown policy"):
        replay_through_pipeline(nodes, pods, "worstfit", seed=1)
    picky = [Pod("p", 1000, 100, 1, 1000, ("T4", "A10"))]
    with pytest.raises(InvalidInput, match="several GPU models"):
        replay_through_pipeline(nodes, picky, "fgd", seed=1)


@needs_traces
def test_souq_leaves_fewer_gpus_unallocated_than_fgd() -> None:
    nodes, pods = read_nodes(NODES), read_pods(PODS)
    fgd = replay_through_pipeline(nodes, pods, "fgd", seed=42).unallocated_at_100
    souq = replay_through_pipeline(nodes, pods, "souq", seed=42).unallocated_at_100
    assert fgd is not None and souq is not None
    assert 3.6 <= fgd <= 5.9  # the paper's seeds' min-max, widened by a point
    # Counting stranded GPU as fragmented: 4.2 % against FGD's 4.7 % (docs/simulator.md).
    assert souq < fgd - 0.3


@needs_traces
def test_souq_does_not_make_hot_spots_of_cpu_only_workers() -> None:
    nodes, pods = read_nodes(NODES), read_pods(PODS)
    souq = cpu_utilisation(nodes, pods, "souq", seed=42, load=0.5)
    binpack = cpu_utilisation(nodes, pods, "binpack", seed=42, load=0.5)
    p95 = round(0.95 * (len(souq) - 1))
    assert binpack[p95] == pytest.approx(1.0, abs=0.01)  # bin-pack fills workers to the brim
    assert souq[p95] <= 0.9  # best-fit's curve stops short of it while there is room
    assert souq[-1] < 1.0
