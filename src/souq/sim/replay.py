"""The reference replay of the ATC'23 experiment: online one-pass packing of the openb pods onto
the GPU nodes, no departures, one policy, one seed (docs/simulator.md, "The ATC'23 method").

It stands apart from Souq's placement pipeline on purpose: it is the yardstick the pipeline-based
simulator is checked against once GPUs are part of Souq's machine and worker model
(docs/simulator.md).

Each pod in arrival order goes to the best-scoring node among those with room for it (CPU,
memory, and GPUs: a sharing pod on one GPU with enough free milli, a ``k``-GPU pod on ``k`` fully
free GPUs); ties go to the node first in a seeded order; a pod that fits nowhere is dropped.
After every attempt the run records (arrived GPU milli, allocated GPU milli).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from souq.errors import InvalidInput
from souq.sim.frag import Workload
from souq.sim.gpu_policies import (
    POLICIES,
    Candidates,
    Ints,
    Policy,
    best_gpus,
    fgd,
    pod_class,
    score,
)
from souq.sim.traces import MILLI, Node, Pod
from souq.sim.workload import (
    arrival_order,
    curve,
    gpu_capacity_milli,
    ranked_gpu_nodes,
    typical_pods,
    value_at,
)

__all__ = ["Run", "replay"]


@dataclass(frozen=True, slots=True)
class Run:
    """One run's outcome: the allocation curve (arrived % → allocated GPU %), the unallocated GPU
    % at 100 % arrived (``None`` when no pod event falls near 100 %), and the pods placed and
    dropped."""

    policy: str
    seed: int
    curve: dict[int, float]
    unallocated_at_100: float | None
    placed: int
    failed: int

    @classmethod
    def of(
        cls,
        policy: str,
        seed: int,
        events: Sequence[tuple[int, int]],
        capacity_milli: int,
        *,
        placed: int,
        failed: int,
    ) -> Run:
        """The run from its (arrived, allocated) GPU milli after each pod attempt."""
        points = curve(events, capacity_milli)
        at_100 = value_at(points, 100)
        return cls(
            policy=policy,
            seed=seed,
            curve=points,
            unallocated_at_100=None if at_100 is None else 100 - at_100,
            placed=placed,
            failed=failed,
        )

    def unallocated(self, x: int) -> float | None:
        alloc = value_at(self.curve, x)
        return None if alloc is None else 100 - alloc


class _Cluster:
    """The nodes' free resources as arrays, in tie-break order."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        width = max(n.gpus for n in nodes)
        self.names = [n.name for n in nodes]
        self.models = np.array([n.model for n in nodes])
        self.cpus = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mems = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.ngpu = np.array([n.gpus for n in nodes], dtype=np.int64)
        self.gpus = np.zeros((len(nodes), width), dtype=np.int64)
        for i, n in enumerate(nodes):
            self.gpus[i, : n.gpus] = MILLI
        self.roomiest = self.gpus.max(axis=1)
        self.nfull = self.ngpu.copy()
        self.classes = np.zeros(len(nodes), dtype=np.int64)
        self.version = np.zeros(len(nodes), dtype=np.int64)

    def feasible(self, pod: Pod) -> np.ndarray:
        ok = (self.cpus >= pod.cpu_milli) & (self.mems >= pod.memory_mib)
        if pod.shares_gpu:
            ok &= self.roomiest >= pod.gpu_milli
        elif pod.num_gpu:
            ok &= self.nfull >= pod.num_gpu
        if pod.gpu_spec and pod.num_gpu:
            ok &= np.isin(self.models, pod.gpu_spec)
        return np.flatnonzero(ok)

    def candidates(self, idx: np.ndarray) -> Candidates:
        return Candidates(self.cpus[idx], self.gpus[idx], self.ngpu[idx], self.classes[idx])

    def free(self, i: int) -> list[int]:
        return [int(f) for f in self.gpus[i]]

    def place(self, i: int, pod: Pod, taken: Sequence[int]) -> None:
        self.version[i] += 1
        self.cpus[i] -= pod.cpu_milli
        self.mems[i] -= pod.memory_mib
        for g in taken:
            self.gpus[i, g] -= pod.gpu_milli
        self.roomiest[i] = self.gpus[i].max()
        self.nfull[i] = int((self.gpus[i] == MILLI).sum())
        self.classes[i] |= pod_class(pod)


class _FgdScores:
    """FGD's scores by pod spec, kept per node until the node changes: a placement changes one
    node, so most of a spec's scores stay valid from one of its pods to the next."""

    def __init__(self, wl: Workload, size: int) -> None:
        self.wl, self.size = wl, size
        self.by_spec: dict[tuple[int, int, int], tuple[Ints, Ints, Ints]] = {}

    def scores(self, cluster: _Cluster, idx: Ints, pod: Pod) -> tuple[Ints, Ints]:
        """The scores of the nodes ``idx`` (in that order) and every node's GPU choice."""
        key = (pod.cpu_milli, pod.gpu_milli, pod.num_gpu)
        if key not in self.by_spec:
            self.by_spec[key] = (
                np.zeros(self.size, dtype=np.int64),
                np.zeros(self.size, dtype=np.int64),
                np.full(self.size, -1, dtype=np.int64),
            )
        scores, choice, seen = self.by_spec[key]
        stale = idx[seen[idx] != cluster.version[idx]]
        if len(stale):
            fresh, picked = fgd(cluster.candidates(stale), pod, self.wl)
            scores[stale], choice[stale] = fresh, picked
            seen[stale] = cluster.version[stale]
        return scores[idx], choice


def replay(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    policy: Policy,
    *,
    seed: int,
    inflate: float = 1.3,
) -> Run:
    """Replay ``pods`` on the GPU nodes of ``nodes`` under ``policy`` with the paper's method."""
    if policy not in POLICIES:
        raise InvalidInput(
            f"unknown policy {policy!r}", hint=f"choose one of {', '.join(POLICIES)}"
        )
    gnodes = [n for _, n in ranked_gpu_nodes(nodes, seed=seed)]
    capacity = gpu_capacity_milli(gnodes)
    cluster = _Cluster(gnodes)
    wl = Workload(typical_pods(pods))
    rng = random.Random(f"policy-{seed}")
    fgd_cache = _FgdScores(wl, len(gnodes))
    arrived = used = placed = failed = 0
    events: list[tuple[int, int]] = []
    for pod in arrival_order(pods, seed=seed, inflate=inflate, capacity_milli=capacity):
        arrived += pod.gpu_request_milli
        idx = cluster.feasible(pod)
        if len(idx) == 0:
            failed += 1
            events.append((arrived, used))
            continue
        if policy == "random":
            node = int(idx[rng.randrange(len(idx))])
            taken = best_gpus(cluster.free(node), pod, rng)
        elif policy == "fgd":
            scores, choice = fgd_cache.scores(cluster, idx, pod)
            node = int(idx[scores.argmax()])
            taken = (int(choice[node]),) if pod.shares_gpu else best_gpus(cluster.free(node), pod)
        else:
            at = (
                0 if len(idx) == 1 else int(score(policy, cluster.candidates(idx), pod)[0].argmax())
            )
            node = int(idx[at])
            taken = best_gpus(cluster.free(node), pod)
        cluster.place(node, pod, taken)
        used += pod.gpu_request_milli
        placed += 1
        events.append((arrived, used))
    return Run.of(policy, seed, events, capacity, placed=placed, failed=failed)
