"""The ATC'23 openb experiment, seeds in parallel processes, and the CPU-only hot-spot check.

``python -m bench.openb [--policy P ...] [--seeds 42-51] [--inflate 1.3] [--jobs 2] [--reference]
[--json] [--plot FILE.png]`` prints, per policy, the unallocated GPU % at 100 % arrived (mean and
sd over the seeds) next to the paper's number, and the slowest seed's time. Policies run through
Souq's placement pipeline (``souq simulate``'s replay), or with ``--reference`` through the
reference replay (the paper's scores over arrays).

``python -m bench.openb --cpu-only [--policy P ...]`` fills the trace's CPU-only nodes with its
CPU-only pods to 30, 50 and 70 % of their cpu and prints the percentiles of worker utilisation.
docs/simulator.md and docs/benchmarks.md record the results.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from souq.sim import experiment
from souq.sim.market_replay import cpu_utilisation
from souq.sim.traces import read_nodes, read_pods

TRACES = Path(__file__).resolve().parent.parent / "traces"  # the repository's copy
NODES = TRACES / "alibaba-gpu-v2023_openb_node_list_all_node.csv"
PODS = TRACES / "alibaba-gpu-v2023_openb_pod_list_default.csv"
POLICIES = ["random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "souq"]


def _percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def cpu_only(policies: list[str], seed: int) -> None:
    nodes, pods = read_nodes(NODES), read_pods(PODS)
    for load in (0.3, 0.5, 0.7):
        for policy in policies:
            u = cpu_utilisation(nodes, pods, policy, seed=seed, load=load)
            print(
                f"load {load:.0%}  {policy:8s} p50 {_percentile(u, 0.5):.2f}"
                f"  p95 {_percentile(u, 0.95):.2f}  max {u[-1]:.2f}",
                flush=True,
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.openb")
    parser.add_argument("--nodes", default=str(NODES))
    parser.add_argument("--pods", default=str(PODS))
    parser.add_argument("--policy", action="append")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--inflate", type=float, default=1.3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--cpu-only", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot")
    a = parser.parse_args(argv)
    if a.cpu_only:
        cpu_only(a.policy or ["souq", "binpack", "spread"], seed=42)
        return
    policies = a.policy or [p for p in POLICIES if not (a.reference and p == "souq")]
    experiment.check_policies(policies, reference=a.reference)
    replay = experiment.reference_replay if a.reference else experiment.pipeline_replay
    seeds = experiment.parse_seeds(a.seeds)
    outcomes = experiment.run_experiment(
        replay, a.nodes, a.pods, policies, seeds, inflate=a.inflate, jobs=a.jobs
    )
    if a.plot:
        experiment.plot(outcomes, a.plot)
    for o in outcomes:
        if a.json:
            print(json.dumps(o.as_json()))
            continue
        mean = o.mean_at_100
        paper = experiment.PAPER.get(o.policy)
        against = "" if paper is None or mean is None else f"   paper {paper:5.2f}"
        against += "" if paper is None or mean is None else f"   diff {mean - paper:+5.2f}"
        per_seed = " ".join(f"{v:.2f}" for v in o.at_100)
        print(
            f"{o.policy:14s} {mean or 0:6.2f} ± {o.sd_at_100:4.2f}{against}"
            f"   slowest seed {max(o.seconds):5.1f} s   seeds {per_seed}",
            flush=True,
        )
    if len(outcomes) > 1:
        seconds = statistics.median(t for o in outcomes for t in o.seconds)
        print(f"median seconds per seed: {seconds:.1f}")


if __name__ == "__main__":
    main()
