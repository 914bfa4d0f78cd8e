"""The ATC'23 openb experiment with the reference replay, seeds in parallel processes.

``python -m bench.openb [--policy P ...] [--seeds 42-51] [--inflate 1.3] [--jobs 2] [--json]``

Prints, per policy, the unallocated GPU % at 100 % arrived (mean and sd over the seeds) next to
the paper's number, and the slowest seed's time; ``--json`` prints one object per policy in the
shape ``souq simulate --json`` will use. docs/simulator.md records the results.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from souq.sim.gpu_policies import POLICIES, Policy
from souq.sim.replay import Run, replay
from souq.sim.traces import read_nodes, read_pods

TRACES = Path(__file__).resolve().parent.parent / "traces"  # the repository's copy
NODES = TRACES / "alibaba-gpu-v2023_openb_node_list_all_node.csv"
PODS = TRACES / "alibaba-gpu-v2023_openb_pod_list_default.csv"

# Unallocated GPU % at 100 % arrived, mean of seeds 42-51 (the paper's published results).
PAPER = {
    "random": 13.70,
    "dotprod": 9.38,
    "gpuclustering": 8.35,
    "gpupacking": 8.22,
    "bestfit": 7.14,
    "fgd": 4.77,
}


def _seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-", 1)
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def _one(args: tuple[str, str, Policy, int, float]) -> tuple[Run, float]:
    nodes_path, pods_path, policy, seed, inflate = args
    nodes, pods = read_nodes(nodes_path), read_pods(pods_path)
    start = time.perf_counter()
    run = replay(nodes, pods, policy, seed=seed, inflate=inflate)
    return run, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.openb")
    parser.add_argument("--nodes", default=str(NODES))
    parser.add_argument("--pods", default=str(PODS))
    parser.add_argument("--policy", action="append", choices=POLICIES)
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--inflate", type=float, default=1.3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    a = parser.parse_args(argv)
    policies: list[Policy] = a.policy or list(POLICIES)
    seeds = _seeds(a.seeds)
    work = [(a.nodes, a.pods, p, s, a.inflate) for p in policies for s in seeds]
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        results = list(pool.map(_one, work))
    for policy in policies:
        runs = [(r, t) for r, t in results if r.policy == policy]
        at_100 = [r.unallocated_at_100 for r, _ in runs if r.unallocated_at_100 is not None]
        mean = statistics.fmean(at_100)
        if a.json:
            xs = sorted({x for r, _ in runs for x in r.curve})
            curve = []
            for x in xs:
                values = [v for r, _ in runs if (v := r.unallocated(x)) is not None]
                curve.append([x, round(statistics.fmean(values), 3)])
            body = {
                "policy": policy,
                "seeds": seeds,
                "unallocated_gpu_pct_at_100": round(mean, 3),
                "curve": curve,
            }
            print(json.dumps(body))
            continue
        sd = statistics.stdev(at_100) if len(at_100) > 1 else 0.0
        slowest = max(t for _, t in runs)
        print(
            f"{policy:14s} {mean:6.2f} ± {sd:4.2f}   paper {PAPER[policy]:5.2f}"
            f"   diff {mean - PAPER[policy]:+5.2f}   slowest seed {slowest:5.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
