"""The ATC'23 experiment through Souq's own placement: the pipeline a broker builds for the
policy, over every worker as the book offers them, and each worker's admission core judging and
recording the claim.

Per pod, in the paper's arrival order (:mod:`souq.sim.workload`): a :class:`PlacementRequest`
for the pod's size; :func:`souq.sim.columns.rank_table` runs the policy's
:class:`~souq.placement.Pipeline` (filters, scorers, weights, tie rule) over every worker; the
winner's :class:`~souq.agent.capacity.admission.Admission` checks the claim as a worker would and
reserves it (choosing the GPUs by the worker's own rule); the worker's row is read back from
what its admission now says. Worker ids follow the seeded node order, so ties that go to the
smallest id go where the paper's go (its scheduler takes the smallest prefixed node name).

:mod:`souq.sim.replay` is the yardstick: the paper's scores written directly over arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from souq.agent.capacity.admission import Admission
from souq.errors import InvalidInput
from souq.model.policy import PlacementDefaults, PlacementPolicy
from souq.model.resources import GPU_MILLI, Resources
from souq.model.worker import WorkerInfo
from souq.placement import PlacementRequest, build_pipeline
from souq.sim.columns import Memo, OfferTable, rank_table
from souq.sim.replay import Run
from souq.sim.traces import Node, Pod
from souq.sim.workload import (
    arrival_order,
    gpu_capacity_milli,
    ranked_gpu_nodes,
    typical_pods,
)

__all__ = ["POLICY_NAMES", "cpu_utilisation", "replay_through_pipeline"]

REGION = "sim"

# ``souq simulate --policy`` names: Souq's default, and the paper's six as placement policies.
POLICY_NAMES: dict[str, PlacementPolicy] = {
    "souq": PlacementPolicy(),
    "fgd": PlacementPolicy(policy="fgd"),
    "bestfit": PlacementPolicy(policy="leftover"),
    "dotprod": PlacementPolicy(policy="dotprod"),
    "gpupacking": PlacementPolicy(policy="gpupacking"),
    "gpuclustering": PlacementPolicy(policy="gpuclustering"),
    "random": PlacementPolicy(policy="random"),
    "binpack": PlacementPolicy(policy="binpack"),
    "spread": PlacementPolicy(policy="spread"),
}


def _resources(pod: Pod) -> Resources:
    if len(pod.gpu_spec) > 1:
        raise InvalidInput(
            f"pod {pod.name} accepts several GPU models ({'|'.join(pod.gpu_spec)})",
            hint="a Souq machine names one gpu_model; keep one model per pod",
        )
    share = pod.shares_gpu
    return Resources(
        cpus=pod.cpu_milli / 1000,
        memory_mb=pod.memory_mib,
        gpus=0 if share else pod.num_gpu,
        gpu_milli=pod.gpu_milli if share else 0,
        gpu_model=pod.gpu_spec[0] if pod.gpu_spec and pod.num_gpu else None,
    )


def _info(a: Admission) -> WorkerInfo:
    return WorkerInfo(
        id=a.worker_id,
        region=a.region,
        capacity=a.capacity,
        allocated=a.reserved,
        version=a.version,
        gpu_free=list(a.gpu_free()),
        gpu_shapes=a.gpu_shapes(),
    )


def _random_gpu(
    worker: Admission, want: Resources, rng: np.random.Generator
) -> tuple[int, ...] | None:
    if want.gpus > 0 or want.gpu_milli == 0:
        return None
    room = [i for i, f in enumerate(worker.gpu_free()) if f >= want.gpu_milli]
    return (room[int(rng.integers(len(room)))],)


def replay_through_pipeline(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    policy: str,
    *,
    seed: int,
    inflate: float = 1.3,
) -> Run:
    """Replay ``pods`` on the GPU nodes of ``nodes`` under ``policy`` (a key of
    :data:`POLICY_NAMES`) with the paper's method, through Souq's placement and admission."""
    if policy not in POLICY_NAMES:
        raise InvalidInput(
            f"unknown policy {policy!r}", hint=f"choose one of {', '.join(POLICY_NAMES)}"
        )
    ranked = ranked_gpu_nodes(nodes, seed=seed)
    gnodes = [n for _, n in ranked]
    capacity = gpu_capacity_milli(gnodes)
    # Ids in rank order: ties that go to the smallest id go to the seed's first node.
    workers = [
        Admission(
            worker_id=f"w{rank:05d}",
            region=REGION,
            capacity=Resources(
                cpus=n.cpu_milli / 1000,
                memory_mb=n.memory_mib,
                gpus=n.gpus,
                gpu_model=n.model or None,
            ),
        )
        for rank, n in ranked
    ]
    table = OfferTable.of([_info(a) for a in workers])
    pipeline = build_pipeline(
        POLICY_NAMES[policy],
        PlacementDefaults(),
        workload=typical_pods(pods),
        largest=(
            max(n.cpu_milli for n in gnodes),
            max(n.gpus for n in gnodes) * GPU_MILLI,
        ),
    )
    memo = Memo(len(workers))
    rng = np.random.default_rng(seed)
    sizes: dict[tuple[int, int, int, int, tuple[str, ...]], Resources] = {}
    arrived = used = placed = failed = 0
    events: list[tuple[int, int]] = []
    order = arrival_order(pods, seed=seed, inflate=inflate, capacity_milli=capacity)
    for k, pod in enumerate(order):
        arrived += pod.gpu_request_milli
        key = (pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)
        want = sizes.get(key) or sizes.setdefault(key, _resources(pod))
        request = PlacementRequest(
            request_id=f"{seed}-{k}", app=f"pod-{k}", region=REGION, resources=want
        )
        winner = rank_table(pipeline, request, table, memo=memo, rng=rng).winner
        if winner is None:
            failed += 1
        else:
            worker = workers[winner]
            worker.check_batch(REGION, want, 1, 0)  # the worker's own judgement of the claim
            # The worker's own GPU choice (the tightest fit), except under random: the paper's
            # Random also picks the GPU at random among those with room.
            worker.reserve(want, _random_gpu(worker, want, rng) if policy == "random" else None)
            table.update(winner, _info(worker))
            used += pod.gpu_request_milli
            placed += 1
        events.append((arrived, used))
    return Run.of(policy, seed, events, capacity, placed=placed, failed=failed)


def cpu_utilisation(
    nodes: Sequence[Node], pods: Sequence[Pod], policy: str, *, seed: int, load: float = 0.5
) -> list[float]:
    """Each worker's CPU utilisation (sorted) after CPU-only machines filled ``load`` of the
    cluster's CPU: the CPU-only nodes of the trace, its CPU-only pods shuffled with ``seed`` and
    drawn again (with replacement) until their CPU request reaches ``load`` of capacity. Whether
    a policy makes hot spots shows in the high percentiles."""
    cpu_nodes = [n for n in nodes if n.gpus == 0]
    cpu_pods = [p for p in pods if p.num_gpu == 0]
    if not cpu_nodes or not cpu_pods:
        raise InvalidInput(
            "the trace has no CPU-only nodes or no CPU-only pods",
            hint="a CPU-only replay needs both",
        )
    workers = [
        Admission(
            worker_id=f"w{i:05d}",
            region=REGION,
            capacity=Resources(cpus=n.cpu_milli / 1000, memory_mb=n.memory_mib),
        )
        for i, n in enumerate(cpu_nodes)
    ]
    table = OfferTable.of([_info(a) for a in workers])
    pipeline = build_pipeline(POLICY_NAMES[policy], PlacementDefaults())
    rng = np.random.default_rng(seed)
    target = load * sum(n.cpu_milli for n in cpu_nodes)
    total = k = 0
    while total < target:
        pod = cpu_pods[int(rng.integers(len(cpu_pods)))]
        total += pod.cpu_milli
        k += 1
        want = _resources(pod)
        request = PlacementRequest(
            request_id=f"{seed}-{k}", app=f"pod-{k}", region=REGION, resources=want
        )
        winner = rank_table(pipeline, request, table, rng=rng).winner
        if winner is not None:
            workers[winner].check_batch(REGION, want, 1, 0)
            workers[winner].reserve(want)
            table.update(winner, _info(workers[winner]))
    return sorted(a.reserved.millicpus / a.capacity.millicpus for a in workers)
