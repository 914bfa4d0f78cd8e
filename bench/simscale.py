"""The fleet replay at trace scale, against a plain numpy first-fit on the same input.

``python -m bench.simscale [--instances 1000000] [--hosts 1300] [--policy P ...]
[--queue [--backfill]] [--one-by-one] [--load 0.6] [--seed 1] [--host-memory-gib 64]
[--replay-hosts N] [--skip-floor]`` draws a trace shaped like Alibaba's cluster-trace-v2017
batch tasks (instance counts, CPU, memory and durations drawn from the committed sample's tasks;
Poisson arrivals at the rate that keeps about ``--load`` of the scarcer resource of ``--hosts``
asked), then

* replays it through the broker's placement stages (:mod:`souq.sim.fleet`), and
* the floor: the same arrivals and departures, each task's instances put on the first hosts
  with room, in host order (numpy, one call per task), no scores at all;

and prints for each the wall time, the CPU time, instances per second and per CPU second, and
the peak resident memory of the process. docs/benchmarks.md records the results.
"""

from __future__ import annotations

import argparse
import heapq
import json
import resource
import time
from pathlib import Path

import numpy as np

from souq.model.policy import PlacementDefaults, PlacementPolicy
from souq.model.resources import Resources
from souq.placement import build_pipeline
from souq.sim.alibaba import read_batch_tasks
from souq.sim.fleet import Settings, replay_fleet
from souq.sim.traces import Task

SAMPLE = Path(__file__).resolve().parent.parent / "traces" / "alibaba-v2017_batch_task_sample.csv"
HOST = Resources(cpus=64, memory_mb=65536)  # the trace's memory shares are of this host's


def synthetic(
    instances: int, hosts: int, load: float, seed: int, host: Resources = HOST
) -> list[Task]:
    """Tasks drawn from the sample's, arriving so that about ``load`` of the scarcer resource
    (CPU or memory) is asked."""
    sample = read_batch_tasks(SAMPLE, host_memory_mib=HOST.memory_mb)
    rng = np.random.default_rng(seed)
    share = [max(t.cpu_milli / host.millicpus, t.memory_mib / host.memory_mb) for t in sample]
    mean_work = np.mean(
        [t.instances * s * (t.duration_s or 0) for t, s in zip(sample, share, strict=True)]
    )
    rate = load * hosts / mean_work  # tasks per second
    tasks: list[Task] = []
    total, now = 0, 0.0
    while total < instances:
        like = sample[int(rng.integers(len(sample)))]
        now += float(rng.exponential(1 / rate))
        count = min(like.instances, instances - total)
        tasks.append(
            Task(
                f"t{len(tasks)}",
                round(now, 3),
                like.duration_s,
                like.cpu_milli,
                like.memory_mib,
                instances=count,
                job=f"j{len(tasks) // 4}",
            )
        )
        total += count
    return tasks


def first_fit(tasks: list[Task], hosts: int, host: Resources = HOST) -> dict[str, float]:
    """The floor: each task's instances on the first hosts with room, in host order."""
    cpu = np.full(hosts, host.millicpus, dtype=np.int64)
    mem = np.full(hosts, host.memory_mb, dtype=np.int64)
    leaving: list[tuple[float, int, np.ndarray, int]] = []
    placed = failed = 0
    for i, t in enumerate(tasks):
        while leaving and leaving[0][0] <= t.arrival_s:
            _, k, counts, _ = heapq.heappop(leaving)
            cpu += counts * tasks[k].cpu_milli
            mem += counts * tasks[k].memory_mib
        room = np.minimum(cpu // max(t.cpu_milli, 1), mem // max(t.memory_mib, 1))
        before = np.cumsum(room) - room
        counts = np.clip(t.instances - before, 0, room)
        n = int(counts.sum())
        placed += n
        failed += t.instances - n
        cpu -= counts * t.cpu_milli
        mem -= counts * t.memory_mib
        if t.duration_s is not None and n:
            heapq.heappush(leaving, (t.arrival_s + t.duration_s, i, counts, n))
    return {"placed": placed, "failed": failed}


def _timed(run):  # type: ignore[no-untyped-def]
    wall, cpu = time.perf_counter(), time.process_time()
    out = run()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=1_000_000)
    parser.add_argument("--hosts", type=int, default=1300, help="the fleet the load is of")
    parser.add_argument(
        "--replay-hosts", type=int, help="replay the same trace on this many hosts instead"
    )
    parser.add_argument(
        "--policy",
        action="append",
        help="a placement policy (repeat to compare; default: the broker's, best-fit)",
    )
    parser.add_argument("--queue", action="store_true")
    parser.add_argument("--backfill", action="store_true", help="with --queue: backfill")
    parser.add_argument("--one-by-one", action="store_true")
    parser.add_argument("--load", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-floor", action="store_true")
    parser.add_argument(
        "--host-memory-gib",
        type=int,
        default=64,
        help="the hosts' memory (the trace's shares stay of 64 GiB: more makes CPU the scarcer)",
    )
    args = parser.parse_args()
    host = Resources(cpus=HOST.cpus, memory_mb=args.host_memory_gib * 1024)
    tasks, made, _ = _timed(
        lambda: synthetic(args.instances, args.hosts, args.load, args.seed, host)
    )
    fleet = args.replay_hosts or args.hosts
    n = sum(t.instances for t in tasks)
    print(f"trace: {len(tasks)} tasks, {n} instances on {fleet} hosts (drawn in {made:.1f} s)")
    rows = []
    if not args.skip_floor:
        floor, wall, cpu = _timed(lambda: first_fit(tasks, fleet, host))
        rows.append(("numpy first-fit", floor["placed"], floor["failed"], wall, cpu))
    settings = Settings(queue=args.queue, backfill=args.backfill, batch=not args.one_by_one)
    reports = []
    for name in args.policy or [None]:
        pipeline = build_pipeline(
            PlacementPolicy(policy=name) if name else None, PlacementDefaults()
        )
        report, wall, cpu = _timed(
            lambda p=pipeline: replay_fleet([host] * fleet, tasks, pipeline=p, settings=settings)
        )
        rows.append((f"fleet replay ({pipeline.name})", report.placed, report.failed, wall, cpu))
        reports.append(report)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for name, placed, failed, wall, cpu in rows:
        print(
            f"{name:28} placed {placed:>9} failed {failed:>9}  wall {wall:7.1f} s  "
            f"cpu {cpu:7.1f} s  {n / wall:>9.0f} instances/s  {n / cpu:>9.0f} per cpu-s"
        )
    if not args.skip_floor:
        for row in rows[1:]:
            print(f"ratio (floor / {row[0]}, instances per cpu-s): {row[4] / rows[0][4]:.1f}")
    print(f"peak resident memory: {peak_mib:.0f} MiB")
    print(
        "policy       util cpu  mem   hot cpu  mem   host cpu p95  max   "
        "host mem p95  max   wait p95"
    )
    for r in reports:
        u, h, x = r.utilisation, r.hot, r.host_utilisation
        print(
            f"{r.policy:12} {u['cpu']:6.1f} {u['memory']:6.1f}  {h['cpu']:6.1f} {h['memory']:6.1f}"
            f"  {x['cpu_p95']:9.1f} {x['cpu_max']:6.1f}"
            f"  {x['memory_p95']:9.1f} {x['memory_max']:6.1f}"
            f"  {r.waits['p95']:8.0f}"
        )
        summary = r.as_json(timeline=False)
        print(json.dumps({k: summary[k] for k in ("waits", "jobs", "failed_by_reason")}))


if __name__ == "__main__":
    main()
