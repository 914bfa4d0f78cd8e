"""The ATC'23 experiment's method (Weng et al., USENIX ATC '23, on the openb trace), as pure
functions: which nodes, in which order the pods arrive, the target workload FGD measures
fragmentation against, and how the curve of unallocated GPU against arrived workload is sampled.

The paper's method is the source of every rule here (docs/simulator.md, "The ATC'23 method").
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence

from souq.errors import InvalidInput
from souq.placement.fragmentation import Shape
from souq.sim.traces import MILLI, Node, Pod

__all__ = [
    "PodSpec",
    "arrival_order",
    "curve",
    "gpu_capacity_milli",
    "gpu_nodes",
    "node_order",
    "ranked_gpu_nodes",
    "typical_pods",
    "value_at",
]


def gpu_nodes(nodes: Iterable[Node]) -> list[Node]:
    """The paper's cluster: the nodes with GPUs, in the file's order (1,213 of openb's 1,523)."""
    return [n for n in nodes if n.gpus > 0]


def gpu_capacity_milli(nodes: Iterable[Node]) -> int:
    return sum(n.gpus for n in nodes) * MILLI


def ranked_gpu_nodes(nodes: Sequence[Node], *, seed: int) -> list[tuple[int, Node]]:
    """The paper's cluster in the seed's tie-break order: (rank, node) of the nodes with GPUs,
    by rank; :class:`~souq.errors.InvalidInput` when no node has GPUs."""
    gnodes = gpu_nodes(nodes)
    if not gnodes:
        raise InvalidInput("the trace has no node with GPUs", hint="check the nodes file")
    return sorted(zip(node_order(len(gnodes), seed=seed), gnodes, strict=True))


def arrival_order(
    pods: Sequence[Pod], *, seed: int, inflate: float, capacity_milli: int
) -> list[Pod]:
    """The pods in the order they are submitted: sorted by name, shuffled with ``seed``, then
    clones drawn uniformly with replacement from the originals appended until the GPU request
    reaches ``inflate`` * capacity.

    The stop rule keeps the simulator's quirk: a drawn clone is refused (and drawing ends) when
    the running total plus the clone's *per-GPU* milli would pass the target, while an accepted
    clone adds its whole request (``num_gpu * gpu_milli``) to the total. ``inflate <= 1`` (or a
    total already past the target) appends nothing.
    """
    rng = random.Random(seed)
    order = sorted(pods, key=lambda p: p.name)
    rng.shuffle(order)
    if not order:
        return order
    target = inflate * capacity_milli
    total = sum(p.gpu_request_milli for p in order)
    originals = list(order)
    while True:
        clone = originals[rng.randrange(len(originals))]
        if total + clone.gpu_milli > target:
            break
        order.append(clone)
        total += clone.gpu_request_milli
    return order


def node_order(count: int, *, seed: int) -> list[int]:
    """Each node's rank in tie-breaks: the simulator prefixes node names with a seeded random
    permutation and the scheduler picks the smallest name among the best scores."""
    ranks = list(range(count))
    random.Random(f"nodes-{seed}").shuffle(ranks)
    return ranks


PodSpec = Shape  # a kind of pod, as FGD's target workload keys it, and its share ``p``


def typical_pods(pods: Iterable[Pod], *, coverage: float = 0.95) -> list[PodSpec]:
    """The target workload M: the most frequent pod specs, CPU-only pods included, in decreasing
    count until they cover ``coverage`` of the pods, their shares renormalised to sum to 1.
    Ties in count are ordered by the spec itself, so the set is deterministic."""
    counts = Counter((p.cpu_milli, p.gpu_milli, p.num_gpu, "|".join(p.gpu_spec)) for p in pods)
    total = sum(counts.values())
    chosen: list[tuple[tuple[int, int, int, str], int]] = []
    covered = 0
    for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if covered >= coverage * total:
            break
        chosen.append((key, n))
        covered += n
    return [PodSpec(c, g, k, m, n / covered) for (c, g, k, m), n in chosen]


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def curve(events: Iterable[tuple[int, int]], capacity_milli: int) -> dict[int, float]:
    """The curve of one run: for each integer arrived % x, the mean allocation rate (%) over the
    pod events whose arrived GPU milli, as a % of capacity, rounds to x.

    ``events`` are (arrived milli, allocated milli) after each pod attempt, failed ones
    included."""
    sums: dict[int, float] = {}
    counts: Counter[int] = Counter()
    for arrived, used in events:
        x = _round_half_up(100 * arrived / capacity_milli)
        sums[x] = sums.get(x, 0.0) + 100 * used / capacity_milli
        counts[x] += 1
    return {x: sums[x] / counts[x] for x in sorted(sums)}


def value_at(points: dict[int, float], x: int) -> float | None:
    """The allocation rate at ``x``: its own bucket, else the mean of its neighbours (x ± 1),
    as the paper's analysis fills an empty bucket."""
    if x in points:
        return points[x]
    near = [points[v] for v in (x - 1, x + 1) if v in points]
    return sum(near) / len(near) if near else None
