"""Batch jobs against Sparrow's yardstick: short tasks at 80 % load on hollow workers that pull.

Suite ``jobs`` (``python -m bench jobs``). A fresh nats-server (JetStream), one ``souq broker``
and one ``souq fleet --jobs 1`` process of ``JOBS_WORKERS`` (100) hollow workers, each running
one job at a time (a hollow run sleeps for the job's run time instead of starting a process).
This process submits ``JOBS_TASKS`` (10,000) jobs through the broker's ``POST /sched/submit`` at
Poisson arrivals, each asking to run for an exponentially distributed time (mean
``JOBS_MEAN_S``, 1 s), so that the workers are 80 % busy. When every job has ended, each job's
response time is its end minus its submit, as the queue recorded them.

The same arrivals (the submit times the queue recorded) and run times then go through
:mod:`souq.sim.queueing`: ``ideal`` (one central queue, infinite knowledge), ``random`` and
``power-of-two``, in this process. The figures: median and p99 response time of each, Souq's as
a ratio to the ideal's, and the throughput (jobs ended per second over the run). Sparrow reports
its median within 12 % of the ideal.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.stats import machine_line
from souq.natsserver import NatsServer
from souq.sim.queueing import RULES, responses
from souq.testing import BrokerProcess, FleetProcess, wait_until

WORKERS = int(os.environ.get("JOBS_WORKERS", "100"))
TASKS = int(os.environ.get("JOBS_TASKS", "10000"))
MEAN_S = float(os.environ.get("JOBS_MEAN_S", "1.0"))
LOAD = float(os.environ.get("JOBS_LOAD", "0.8"))
SEED = 7
REGION = "bench"


def _plan(seed: int) -> tuple[list[float], list[float]]:
    """Arrival offsets (s) and run times (s): Poisson arrivals at LOAD of the workers."""
    rng = random.Random(seed)
    rate = LOAD * WORKERS / MEAN_S
    t, arrivals = 0.0, []
    for _ in range(TASKS):
        t += rng.expovariate(rate)
        arrivals.append(t)
    runs = [rng.expovariate(1 / MEAN_S) for _ in range(TASKS)]
    return arrivals, runs


async def _submit_all(url: str, arrivals: list[float], runs: list[float]) -> float:
    """Submit each job at its arrival offset; the wall time the submissions took."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        start = time.monotonic()
        pending: set[asyncio.Task[None]] = set()

        async def one(i: int) -> None:
            body = {"name": f"t{i:06d}", "command": ["sleep", f"{runs[i]:.3f}"], "cpus": 0}
            r = await http.post("/sched/submit", json=body)
            if r.status_code != 201:
                raise RuntimeError(f"submit {i}: {r.status_code} {r.text}")

        for i, at in enumerate(arrivals):
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(i))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
        return time.monotonic() - start


def _summary(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=100)
    return {"median_s": statistics.median(values), "p99_s": q[98]}


def run() -> dict[str, Any]:
    arrivals, runs = _plan(SEED)
    with tempfile.TemporaryDirectory(prefix="souq-bench-jobs-") as tmp:
        root = Path(tmp)
        with NatsServer(store_dir=root / "nats") as nats:
            fleet = FleetProcess(
                nats_url=nats.url,
                region=REGION,
                workers=WORKERS,
                log_path=root / "fleet.log",
                extra_args=["--jobs", "1"],
            )
            broker = BrokerProcess(nats_url=nats.url, log_path=root / "broker.log")
            try:
                fleet.start(timeout=300)
                broker.start()
                submit_s = asyncio.run(_submit_all(broker.url, arrivals, runs))
                with httpx.Client(base_url=broker.url, timeout=60) as http:

                    def ended() -> list[dict[str, Any]] | None:
                        answer = http.get("/sched/list")
                        if answer.status_code != 200:
                            print(f"listing the jobs: {answer.status_code} {answer.text[:200]}")
                            return None
                        jobs: list[dict[str, Any]] = answer.json()
                        done = [j for j in jobs if j["state"] in ("succeeded", "failed")]
                        return jobs if len(done) >= TASKS else None

                    jobs = wait_until(ended, timeout=900, interval=3.0, message="every job ended")
            finally:
                fleet.stop()
                broker.stop()
    by_name = {j["name"]: j for j in jobs}
    order = [by_name[f"t{i:06d}"] for i in range(TASKS)]
    submitted = [j["submitted_ms"] / 1000 for j in order]
    t0 = min(submitted)
    arrived = [s - t0 for s in submitted]
    souq = [(j["finished_ms"] - j["submitted_ms"]) / 1000 for j in order]
    span = (max(j["finished_ms"] for j in order) - min(j["submitted_ms"] for j in order)) / 1000
    result: dict[str, Any] = {
        "workers": WORKERS,
        "tasks": TASKS,
        "mean_run_s": MEAN_S,
        "load": LOAD,
        "failed": sum(1 for j in order if j["state"] != "succeeded"),
        "ran_twice": sum(1 for j in order if j["attempts"] > 1),
        "submit_s": round(submit_s, 1),
        "throughput_per_s": round(TASKS / span, 1),
        "souq": _summary(souq),
    }
    for rule in RULES:
        result[rule] = _summary(responses(arrived, runs, WORKERS, rule, seed=SEED))
    ideal = result["ideal"]
    for name in ("souq", "random", "power-of-two"):
        result[name]["median_x_ideal"] = round(result[name]["median_s"] / ideal["median_s"], 3)
        result[name]["p99_x_ideal"] = round(result[name]["p99_s"] / ideal["p99_s"], 3)
    return result


def main() -> None:
    print(machine_line(), flush=True)
    print(json.dumps(run(), indent=2))


if __name__ == "__main__":
    main()
