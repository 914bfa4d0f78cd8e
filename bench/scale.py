"""Placement at scale: brokers against a hollow fleet (``souq fleet``), all real processes on
real NATS, with the load generator in this process.

Suites (``python -m bench NAME``):

* ``scale`` — 1,000 hollow workers. Single creates from 32 concurrent clients, and batch
  creates (100 machines each) from 32 concurrent clients, against 1, 2 and 4 brokers.
* ``tradeoff`` — the sampling trade-off on one broker and 1,000 hollow workers: asking all of
  them against asking a sample, live (latency, throughput, broker CPU) and in a replay of the
  real pipeline (placement quality).
* ``c1m`` — Nomad's C1M in miniature: 100,000 machines onto 5,000 hollow workers with batch
  creates, reporting the rate, the total time and the brokers' memory.

Every run uses ``skip_launch=False``: each machine is claimed, recorded and "started" on its
hollow worker (the driver starts nothing), so the answer is a started machine.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from bench.stats import machine_line, summary_ms
from souq.market.sampling import plan_sample
from souq.model import Offer, Resources, WorkerInfo
from souq.natsserver import NatsServer
from souq.placement import PlacementRequest, default_pipeline
from souq.testing import BrokerProcess, FleetProcess, wait_until

REGION = "scale"
CONCURRENCY = 32
GUEST = {"cpus": 0.1, "memory_mb": 64}
WORKER_CPUS = 64
WORKER_MEMORY_MB = 262_144


@dataclass
class Bench:
    root: Path
    nats: NatsServer
    fleet: FleetProcess
    brokers: list[BrokerProcess]

    @property
    def urls(self) -> list[str]:
        return [b.url for b in self.brokers]

    def rss_mb(self) -> dict[str, float]:
        out = {f"broker{i}": _rss(b.process) for i, b in enumerate(self.brokers)}
        out["fleet"] = _rss(self.fleet.process)
        return out


def _rss(proc: object) -> float:
    pid = getattr(proc, "pid", None)
    if pid is None:
        return 0.0
    return round(psutil.Process(pid).memory_info().rss / 2**20, 1)


def _start(
    root: Path,
    workers: int,
    brokers: int,
    broker_args: Sequence[str] = (),
    *,
    cpus: float = WORKER_CPUS,
    memory_mb: int = WORKER_MEMORY_MB,
) -> Bench:
    nats = NatsServer(store_dir=root / "nats")
    nats.start()
    fleet = FleetProcess(
        nats_url=nats.url,
        region=REGION,
        workers=workers,
        cpus=cpus,
        memory_mb=memory_mb,
        log_path=root / "fleet.log",
    )
    fleet.start(timeout=300)
    bench = Bench(root, nats, fleet, [])
    _add_brokers(bench, brokers, broker_args)
    return bench


def _add_brokers(bench: Bench, n: int, args: Sequence[str] = ()) -> None:
    for _ in range(n):
        i = len(bench.brokers)
        broker = BrokerProcess(
            nats_url=bench.nats.url, log_path=bench.root / f"broker{i}.log", extra_args=args
        )
        broker.start()
        bench.brokers.append(broker)
    want = bench.fleet.workers

    for url in bench.urls:

        def ready(url: str = url) -> bool:
            return bool(httpx.get(url + "/healthz", timeout=10).json()["workers"] >= want)

        wait_until(ready, timeout=120, interval=0.2, message="the broker to see the fleet")


def _stop_brokers(bench: Bench) -> None:
    for broker in bench.brokers:
        broker.stop()
    bench.brokers = []


def _stop(bench: Bench) -> None:
    _stop_brokers(bench)
    bench.fleet.stop(timeout=120)
    bench.nats.stop()


async def _load(
    urls: Sequence[str],
    path: str,
    body: dict[str, object],
    *,
    requests: int,
    per_request: Callable[[httpx.Response], int],
    concurrency: int = CONCURRENCY,
) -> dict[str, object]:
    """``requests`` POSTs from ``concurrency`` clients, spread round-robin over the brokers."""
    latencies: list[float] = []
    placed = 0
    failed = 0
    reasons: Counter[str] = Counter()
    remaining = requests
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def worker(n: int) -> None:
            nonlocal remaining, placed, failed
            url = urls[n % len(urls)] + path
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                r = await client.post(url, json=body)
                latencies.append(time.perf_counter() - t0)
                if r.status_code == 201:
                    placed += per_request(r)
                else:
                    failed += 1
                    reasons[_reason(r)] += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        wall = time.perf_counter() - t0
    return {
        "placements_per_s": round(placed / wall, 1),
        "placed": placed,
        "failed_requests": failed,
        "failures": dict(reasons),
        "wall_s": round(wall, 2),
        "latency_ms": summary_ms(latencies),
    }


def _single_body() -> dict[str, object]:
    return {"region": REGION, "config": {"cmd": ["serve"], "guest": GUEST}}


def _batch_body(count: int) -> dict[str, object]:
    return {"region": REGION, "count": count, "config": {"cmd": ["serve"], "guest": GUEST}}


def _singles(
    bench: Bench, app: str, requests: int, concurrency: int = CONCURRENCY
) -> dict[str, object]:
    cpu0 = _broker_cpu_s(bench)
    result = asyncio.run(
        _load(
            bench.urls,
            f"/v1/apps/{app}/machines",
            _single_body(),
            requests=requests,
            per_request=lambda r: 1,
            concurrency=concurrency,
        )
    )
    placed = result["placed"]
    assert isinstance(placed, int)
    result["concurrency"] = concurrency
    result["broker_cpu_ms_per_request"] = round(1000 * (_broker_cpu_s(bench) - cpu0) / requests, 2)
    return result


def _broker_cpu_s(bench: Bench) -> float:
    total = 0.0
    for broker in bench.brokers:
        if broker.process is not None:
            times = psutil.Process(broker.process.pid).cpu_times()
            total += times.user + times.system
    return total


def _reason(r: httpx.Response) -> str:
    """A failed request as ``HTTP-status status-code``, e.g. ``409 insufficient_capacity``."""
    try:
        return f"{r.status_code} {r.json().get('status', '?')}"
    except ValueError:
        return str(r.status_code)


def _batches(
    bench: Bench, app: str, requests: int, count: int, concurrency: int = CONCURRENCY
) -> dict[str, object]:
    result = asyncio.run(
        _load(
            bench.urls,
            f"/v1/apps/{app}/machines/batch",
            _batch_body(count),
            requests=requests,
            per_request=lambda r: int(r.json()["placed"]),
            concurrency=concurrency,
        )
    )
    result["batch"] = count
    result["concurrency"] = concurrency
    return result


# -- the sampling trade-off, replayed through the real pipeline --------------------------------


def replay_quality(
    workers: int = 1000, placements: int = 1500, sample: int | None = None, seed: int = 7
) -> dict[str, float]:
    """Place ``placements`` one-off machines of random sizes on ``workers`` workers (random
    starting loads) with the default pipeline, asking everyone (``sample=None``) or a seeded
    random sample; report how often the best worker in the region was missed, how much score
    was lost, and the spread of utilisation at the end. Pure: the same decisions the broker
    makes, without the bus."""
    rng = random.Random(seed)
    pipeline = default_pipeline()
    cap = Resources(cpus=16, memory_mb=65_536)
    used = [
        Resources(cpus=round(rng.uniform(0, 8), 1), memory_mb=rng.randrange(0, 32_768))
        for _ in range(workers)
    ]
    ids = [f"w{i:05d}" for i in range(workers)]

    def offer(i: int) -> Offer:
        info = WorkerInfo(id=ids[i], region="r", capacity=cap, allocated=used[i])
        return Offer(worker=info, eligible=True)

    offers = [offer(i) for i in range(workers)]
    missed = 0
    regret = 0.0
    percentile = 0.0  # where the chosen worker stands in the full ranking (1.0: the best)
    refused = 0
    for n in range(placements):
        want = Resources(cpus=rng.choice([0.25, 0.5, 1, 2]), memory_mb=rng.choice([256, 1024]))
        request = PlacementRequest(request_id=f"r{n}", app="a", region="r", resources=want)
        full = pipeline.rank(request, offers)
        if not full.ordered:
            refused += 1
            continue
        best = full.outcomes[0].score or 0.0
        if sample is None:
            chosen = full
        else:
            plan = plan_sample(request.request_id, ids, above=0, factor_d=2, minimum=sample)
            assert plan.workers is not None
            asked = set(plan.workers)
            chosen = pipeline.rank(request, [o for o in offers if o.worker.id in asked])
            if not chosen.ordered:
                refused += 1
                continue
        winner = chosen.ordered[0].worker.id
        score = chosen.outcomes[0].score or 0.0
        position = next(i for i, o in enumerate(full.ordered) if o.worker.id == winner)
        percentile += 1 - position / len(full.ordered)
        if winner != full.ordered[0].worker.id and score < best:
            missed += 1
            regret += best - score
        i = ids.index(winner)
        used[i] = used[i].plus(want)
        offers[i] = offer(i)
    utils = sorted(u.cpus / cap.cpus for u in used)
    mean = sum(utils) / len(utils)
    return {
        "asked": workers if sample is None else sample,
        "best_missed_pct": round(100 * missed / placements, 1),
        "mean_score_lost": round(regret / placements, 4),
        "chosen_percentile_mean": round(100 * percentile / placements, 1),
        "refused": refused,
        "cpu_util_mean": round(mean, 3),
        "cpu_util_p10": round(utils[len(utils) // 10], 3),
        "cpu_util_p90": round(utils[9 * len(utils) // 10], 3),
        "workers_above_90pct": sum(u > 0.9 for u in utils),
        "workers_empty": sum(u == 0 for u in utils),
    }


# -- suites ------------------------------------------------------------------------------------


def scale(workers: int = 1000, singles: int = 3000, batches: int = 200, batch: int = 100) -> None:
    print(f"# scale benchmark — {workers} hollow workers — {machine_line()}", flush=True)
    results: dict[str, object] = {"workers": workers, "concurrency": CONCURRENCY}
    with tempfile.TemporaryDirectory(prefix="souq-bench-") as tmp:
        bench = _start(Path(tmp), workers, 1)
        try:
            _singles(bench, "warm", 300)
            for n in (1, 2, 4):
                if len(bench.brokers) < n:
                    _add_brokers(bench, n - len(bench.brokers))
                label = f"{n}_broker{'s' if n > 1 else ''}"
                results[f"single_{label}"] = _singles(bench, f"single{n}", singles)
                print(label, "single", json.dumps(results[f"single_{label}"]), flush=True)
                results[f"batch_{label}"] = _batches(bench, f"batch{n}", batches, batch)
                print(label, "batch", json.dumps(results[f"batch_{label}"]), flush=True)
            results["rss_mb"] = bench.rss_mb()
        finally:
            _stop(bench)
    _write("scale", results)


def tradeoff(workers: int = 1000, requests: int = 500) -> None:
    """Candidates from the book, against asking a sample for offers, against asking everyone:
    live on one broker (one client for latency and the broker's CPU per placement, 32 for
    throughput), then replayed through the real pipeline for placement quality."""
    print(f"# sampling trade-off — {workers} hollow workers — {machine_line()}", flush=True)
    results: dict[str, object] = {"workers": workers}
    with tempfile.TemporaryDirectory(prefix="souq-bench-") as tmp:
        bench = _start(Path(tmp), workers, 0)
        try:
            offers = ["--candidates-from", "offers"]
            for mode, args in (
                ("book", []),
                ("sampled", offers),
                ("ask-all", [*offers, "--sample-above", str(workers)]),
            ):
                _stop_brokers(bench)
                _add_brokers(bench, 1, args)
                _singles(bench, f"warm-{mode}", 50, concurrency=1)
                for clients in (1, CONCURRENCY):
                    key = f"{mode}_{clients}_clients"
                    results[key] = _singles(bench, f"t-{mode}-{clients}", requests, clients)
                    print(key, json.dumps(results[key]), flush=True)
        finally:
            _stop(bench)
    results["quality"] = {
        "ask_all": replay_quality(sample=None),
        "sample_8": replay_quality(sample=8),
        "sample_2": replay_quality(sample=2),
    }
    _write("tradeoff", results)


def c1m(
    workers: int = 5000,
    machines: int = 100_000,
    batch: int = 500,
    brokers: int = 1,
    concurrency: int = 8,
    worker_cpus: float = 4,
) -> None:
    """Each worker offers ``worker_cpus`` (40 machines of 0.1 cpu): 100,000 machines fill the
    fleet to half, so best-fit has to use over half of the 5,000 workers."""
    print(f"# c1m benchmark — {machines} machines onto {workers} workers — {machine_line()}")
    results: dict[str, object] = {"workers": workers, "machines": machines, "brokers": brokers}
    with tempfile.TemporaryDirectory(prefix="souq-bench-") as tmp:
        t_fleet = time.perf_counter()
        bench = _start(Path(tmp), workers, brokers, cpus=worker_cpus, memory_mb=16_384)
        results["worker_cpus"] = worker_cpus
        results["fleet_start_s"] = round(time.perf_counter() - t_fleet, 1)
        try:
            results["rss_mb_before"] = bench.rss_mb()
            run = _batches(bench, "c1m", machines // batch, batch, concurrency)
            results["run"] = run
            results["rss_mb_after"] = bench.rss_mb()
            placed = run["placed"]
            assert isinstance(placed, int)
            r = httpx.get(bench.urls[0] + "/v1/workers", timeout=120).json()
            results["machines_on_workers"] = sum(w["machines"] for w in r)
            results["workers_used"] = sum(1 for w in r if w["machines"])
        finally:
            _stop(bench)
    _write("c1m", results)


def _write(name: str, results: dict[str, object]) -> None:
    print(json.dumps(results, indent=2))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"machine": machine_line(), **results}, indent=2))


def main_scale() -> None:
    scale()


def main_tradeoff() -> None:
    tradeoff()


def main_c1m() -> None:
    c1m()
