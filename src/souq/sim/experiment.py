"""The ATC'23 experiment over many seeds: runs in parallel processes, the summary per policy
(``souq simulate --json``'s shape) and the figure of unallocated GPU against arrived workload.

Each seed is one process's work: it reads the trace files itself (cheaper than sending 8,000
pods through a pipe) and returns its :class:`~souq.sim.replay.Run`.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from souq.errors import InvalidInput
from souq.sim.replay import Run
from souq.sim.traces import Node, Pod, read_nodes, read_pods

__all__ = [
    "PAPER",
    "Outcome",
    "check_policies",
    "parse_seeds",
    "pipeline_replay",
    "plot",
    "reference_replay",
    "require_plotting",
    "run_experiment",
]

# Unallocated GPU % at 100 % arrived, mean of seeds 42-51: the paper's published results.
PAPER: dict[str, float] = {
    "random": 13.70,
    "dotprod": 9.38,
    "gpuclustering": 8.35,
    "gpupacking": 8.22,
    "bestfit": 7.14,
    "fgd": 4.77,
}


def parse_seeds(text: str) -> list[int]:
    """``42-51`` (a range, both ends in), ``1,5,9`` or ``7``."""
    try:
        if "-" in text.strip("-"):
            low, high = text.split("-", 1)
            seeds = list(range(int(low), int(high) + 1))
        else:
            seeds = [int(s) for s in text.split(",")]
    except ValueError:
        seeds = []
    if not seeds:
        raise InvalidInput(
            f"{text!r} is not a list of seeds", hint="write a range (42-51) or a list (1,2,3)"
        )
    return seeds


@dataclass(frozen=True)
class Outcome:
    """One policy's runs, one per seed, and how long each took."""

    policy: str
    runs: tuple[Run, ...]
    seconds: tuple[float, ...]

    @property
    def seeds(self) -> list[int]:
        return [r.seed for r in self.runs]

    @property
    def at_100(self) -> list[float]:
        return [r.unallocated_at_100 for r in self.runs if r.unallocated_at_100 is not None]

    @property
    def mean_at_100(self) -> float | None:
        values = self.at_100
        return statistics.fmean(values) if values else None

    @property
    def sd_at_100(self) -> float:
        values = self.at_100
        return statistics.stdev(values) if len(values) > 1 else 0.0

    def curve(
        self, estimator: Callable[[Sequence[float]], float] = statistics.fmean
    ) -> list[list[float]]:
        """[[arrived %, unallocated GPU %], ...] over the seeds (the mean, or ``estimator``)."""
        xs = sorted({x for r in self.runs for x in r.curve})
        out: list[list[float]] = []
        for x in xs:
            values = [v for r in self.runs if (v := r.unallocated(x)) is not None]
            if values:
                out.append([x, round(estimator(values), 3)])
        return out

    def as_json(self) -> dict[str, Any]:
        mean = self.mean_at_100
        return {
            "policy": self.policy,
            "seeds": self.seeds,
            "unallocated_gpu_pct_at_100": None if mean is None else round(mean, 3),
            "curve": self.curve(),
        }


Replay = Callable[[str, str, str, int, float], Run]


def _one(job: tuple[Replay, str, str, str, int, float]) -> tuple[Run, float]:
    replay, nodes, pods, policy, seed, inflate = job
    start = time.perf_counter()
    run = replay(nodes, pods, policy, seed, inflate)
    return run, time.perf_counter() - start


def run_experiment(
    replay: Replay,
    nodes: str | Path,
    pods: str | Path,
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    inflate: float = 1.3,
    jobs: int = 2,
) -> list[Outcome]:
    """Every (policy, seed) through ``replay(nodes, pods, policy, seed, inflate)``, ``jobs``
    processes at a time (1: in this process)."""
    work = [(replay, str(nodes), str(pods), p, s, inflate) for p in policies for s in seeds]
    if jobs <= 1 or len(work) == 1:
        results = [_one(w) for w in work]
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(work))) as pool:
            results = list(pool.map(_one, work))
    out = []
    for policy in policies:
        mine = [(r, t) for r, t in results if r.policy == policy]
        out.append(Outcome(policy, tuple(r for r, _ in mine), tuple(t for _, t in mine)))
    return out


def require_plotting() -> None:
    """:class:`InvalidInput` unless matplotlib can be loaded: asked before a run whose figure is
    wanted, so that a run of minutes does not end in this error."""
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError as exc:
        raise InvalidInput(
            "--plot needs matplotlib, which is not installed",
            hint="pip install 'souq[sim]' (or matplotlib), or leave out --plot",
        ) from exc


def plot(outcomes: Sequence[Outcome], path: str | Path, *, low: int = 75, high: int = 130) -> Path:
    """The paper's figure: unallocated GPU % against arrived workload (% of GPU capacity), the
    median over seeds with the 25-75 % band, and the ideal line (100 - x). Written as PNG."""
    require_plotting()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=150)
    xs_all = list(range(low, high + 1))
    ax.plot(xs_all, [max(0, 100 - x) for x in xs_all], "k:", lw=1, label="ideal")
    for o in outcomes:
        median = {x: y for x, y in _by_x(o.curve(statistics.median)).items() if low <= x <= high}
        q1 = _by_x(o.curve(lambda v: _quantile(v, 0.25)))
        q3 = _by_x(o.curve(lambda v: _quantile(v, 0.75)))
        xs = sorted(median)
        ax.plot(xs, [median[x] for x in xs], lw=1.5, label=o.policy)
        ax.fill_between(xs, [q1[x] for x in xs], [q3[x] for x in xs], alpha=0.2)
    ax.set_xlim(low, high)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("Arrived workloads (% of cluster GPU capacity)")
    ax.set_ylabel("Unalloc. GPU (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    target = Path(path)
    fig.savefig(target)
    plt.close(fig)
    return target


def _by_x(points: list[list[float]]) -> dict[float, float]:
    return {p[0]: p[1] for p in points}


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


@functools.lru_cache(maxsize=4)
def _trace(nodes: str, pods: str) -> tuple[list[Node], list[Pod]]:
    return read_nodes(nodes), read_pods(pods)


def check_policies(policies: Sequence[str], *, reference: bool) -> None:
    """Refuse an unknown policy name, naming the known ones."""
    from souq.sim.gpu_policies import POLICIES
    from souq.sim.market_replay import POLICY_NAMES

    known: Sequence[str] = POLICIES if reference else tuple(POLICY_NAMES)
    for name in policies:
        if name not in known:
            raise InvalidInput(
                f"unknown policy {name!r}" + (" for the reference replay" if reference else ""),
                hint=f"choose among {', '.join(known)}",
            )


def pipeline_replay(nodes: str, pods: str, policy: str, seed: int, inflate: float) -> Run:
    """One seed through Souq's placement pipeline and workers' admission
    (:mod:`souq.sim.market_replay`), from the trace files."""
    from souq.sim.market_replay import replay_through_pipeline

    node_list, pod_list = _trace(nodes, pods)
    return replay_through_pipeline(node_list, pod_list, policy, seed=seed, inflate=inflate)


def reference_replay(nodes: str, pods: str, policy: str, seed: int, inflate: float) -> Run:
    """One seed of the reference replay (:mod:`souq.sim.replay`), from the trace files."""
    from souq.sim.replay import replay

    node_list, pod_list = _trace(nodes, pods)
    return replay(node_list, pod_list, policy, seed=seed, inflate=inflate)  # type: ignore[arg-type]
