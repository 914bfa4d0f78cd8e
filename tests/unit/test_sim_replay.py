"""The reference replay: one seed of each policy on the whole openb trace (a few seconds in
all), and the run's bookkeeping on a small cluster."""

from __future__ import annotations

import pytest
from bench.openb import NODES, PODS

from souq.errors import InvalidInput
from souq.sim.gpu_policies import POLICIES, Policy
from souq.sim.replay import replay
from souq.sim.traces import Node, Pod, read_nodes, read_pods

needs_traces = pytest.mark.skipif(not PODS.exists(), reason="the openb trace is not here")

# Unallocated GPU % at 100 % arrived: the paper's min-max over seeds 42-51, widened by a point.
PAPER_RANGE = {
    "random": (12.2, 15.2),
    "dotprod": (8.0, 10.7),
    "gpuclustering": (6.2, 10.4),
    "gpupacking": (6.4, 9.9),
    "bestfit": (6.0, 8.4),
    "fgd": (3.6, 5.9),
}


@needs_traces
@pytest.mark.parametrize("policy", POLICIES)
def test_one_seed_of_each_policy_lands_in_the_papers_range(policy: Policy) -> None:
    run = replay(read_nodes(NODES), read_pods(PODS), policy, seed=42)
    low, high = PAPER_RANGE[policy]
    assert run.unallocated_at_100 is not None
    assert low <= run.unallocated_at_100 <= high
    assert run.placed + run.failed > 10_000
    assert run.unallocated(100) == pytest.approx(run.unallocated_at_100)
    # Before the cluster fills, every policy places everything: unallocated = 100 - arrived.
    assert run.unallocated(30) == pytest.approx(70, abs=0.6)


def _cluster() -> tuple[list[Node], list[Pod]]:
    nodes = [Node(f"n{i}", 32_000, 128_000, g, "T4") for i, g in enumerate([2, 4, 0, 8])]
    pods = [Pod(f"p{i}", 2000, 1000, 1, 250 * (1 + i % 4)) for i in range(40)]
    pods += [Pod("big", 4000, 1000, 4, 1000), Pod("cpu", 1000, 1000, 0, 0)]
    return nodes, pods


@pytest.mark.parametrize("policy", POLICIES)
def test_a_small_run_accounts_for_every_pod(policy: Policy) -> None:
    nodes, pods = _cluster()
    run = replay(nodes, pods, policy, seed=1)
    assert run.placed + run.failed >= len(pods)
    assert all(0 <= v <= 100 for v in run.curve.values())
    assert run == replay(nodes, pods, policy, seed=1)


def test_an_unknown_policy_or_a_cluster_without_gpus_is_refused() -> None:
    nodes, pods = _cluster()
    with pytest.raises(InvalidInput, match="unknown policy"):
        replay(nodes, pods, "worstfit", seed=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="no node with GPUs"):
        replay([Node("c", 1000, 1000, 0, "")], pods, "fgd", seed=1)
