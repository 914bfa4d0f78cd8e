"""The spine: create→started latency of one machine on a one-region, four-worker cluster, beside
two floors measured in the same run: an HTTP round trip to the broker plus spawning the same
process directly, and the placement path's skeleton (the same processes and hops with none of
Souq's work on them, :mod:`bench.skeleton`); and placements per second with 32 concurrent
clients."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from bench import skeleton
from bench.stats import machine_line, summary_ms
from souq.testing import Cluster, auth_headers

REGION = "bench"
CMD = ["sleep", "3600"]
SEQUENTIAL = 300
WARMUP = 30
CONCURRENCY = 32
PLACEMENTS = 1500


def _floor(client: httpx.Client, n: int) -> tuple[list[float], list[float]]:
    rtt: list[float] = []
    spawn: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.get("/healthz")
        rtt.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        proc = skeleton.spawn(CMD)
        spawn.append(time.perf_counter() - t0)
        proc.kill()
        proc.wait()
    return rtt, spawn


def _create_started(client: httpx.Client, app: str, n: int) -> list[float]:
    """Create ``n`` machines one after another, timing each POST until it answers with the
    machine ``started``; destroy them all afterwards, outside the timing (a destroy's tail of
    work on the agent would otherwise overlap the next create)."""
    body = {"region": REGION, "config": {"cmd": CMD, "guest": {"cpus": 0.01, "memory_mb": 1}}}
    times: list[float] = []
    ids: list[str] = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.post(f"/v1/apps/{app}/machines", json=body)
        elapsed = time.perf_counter() - t0
        r.raise_for_status()
        machine = r.json()
        assert machine["state"] == "started", machine["state"]
        times.append(elapsed)
        ids.append(machine["id"])
    for mid in ids:
        client.delete(f"/v1/apps/{app}/machines/{mid}", params={"force": "true"})
    return times


async def _concurrent(
    api: str, app: str, total: int, skip_launch: bool
) -> tuple[float, list[float], list[str]]:
    body = {
        "region": REGION,
        "skip_launch": skip_launch,
        "config": {"cmd": CMD, "guest": {"cpus": 0.01, "memory_mb": 1}},
    }
    latencies: list[float] = []
    ids: list[str] = []
    remaining = total
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    headers = auth_headers()  # the test cluster runs secured, as souq dev does
    async with httpx.AsyncClient(
        base_url=api, timeout=60, limits=limits, headers=headers
    ) as client:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                r = await client.post(f"/v1/apps/{app}/machines", json=body)
                latencies.append(time.perf_counter() - t0)
                r.raise_for_status()
                ids.append(r.json()["id"])

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        wall = time.perf_counter() - t0
    return wall, latencies, ids


async def _destroy_all(api: str, app: str, ids: list[str]) -> None:
    async with httpx.AsyncClient(base_url=api, timeout=60, headers=auth_headers()) as client:
        sem = asyncio.Semaphore(16)

        async def one(mid: str) -> None:
            async with sem:
                await client.delete(f"/v1/apps/{app}/machines/{mid}", params={"force": "true"})

        await asyncio.gather(*(one(m) for m in ids))


def cluster(root: Path) -> Cluster:
    """The spine's cluster (not started): one region of four agents that never run out of
    capacity, and one broker."""
    return Cluster(root, regions={REGION: 4}, cpus=1000, memory_mb=1_000_000)


def create_started(api: str) -> dict[str, object]:
    """create→started on the spine's cluster at ``api``, beside its floor and the skeleton, all
    measured now: the figures of :func:`main` without the concurrent placements."""
    with httpx.Client(base_url=api, timeout=30, headers=auth_headers()) as client:
        _create_started(client, "warm", WARMUP)
        _floor(client, WARMUP)
        rtt, spawn = _floor(client, SEQUENTIAL)
        created = _create_started(client, "seq", SEQUENTIAL)
    floor = [a + b for a, b in zip(rtt, spawn, strict=True)]
    results: dict[str, object] = {
        "floor_http_rtt_ms": summary_ms(rtt),
        "floor_spawn_ms": summary_ms(spawn),
        "floor_total_ms": summary_ms(floor),
        "create_started_ms": summary_ms(created),
    }
    # The skeleton's processes run after the cluster's creates, not beside them: with offers
    # gathered before the claim (Souq's hops before the book), and with one claim only (the
    # hops of the book path, Souq's default now).
    results["skeleton_ms"] = summary_ms(skeleton.measure(SEQUENTIAL, WARMUP))
    results["skeleton_one_hop_ms"] = summary_ms(skeleton.measure(SEQUENTIAL, WARMUP, offers=False))
    c, f, k = results["create_started_ms"], results["floor_total_ms"], results["skeleton_ms"]
    k1 = results["skeleton_one_hop_ms"]
    assert isinstance(c, dict) and isinstance(f, dict) and isinstance(k, dict)
    assert isinstance(k1, dict)
    results["ratio_p50_vs_floor"] = round(c["p50"] / f["p50"], 2)
    results["ratio_p50_vs_skeleton"] = round(c["p50"] / k["p50"], 2)
    results["ratio_p50_vs_skeleton_one_hop"] = round(c["p50"] / k1["p50"], 2)
    return results


def main() -> None:
    print(f"# spine benchmark — {machine_line()}")
    with (
        tempfile.TemporaryDirectory(prefix="souq-bench-") as tmp,
        cluster(Path(tmp)) as running,
    ):
        api = running.api_url
        results = create_started(api)
        for skip in (True, False):
            label = "placements_skip_launch" if skip else "placements_started"
            wall, lat, ids = asyncio.run(
                _concurrent(api, label.replace("_", "-"), PLACEMENTS, skip)
            )
            results[label] = {
                "per_s": round(len(ids) / wall, 1),
                "latency_ms": summary_ms(lat),
                "n": len(ids),
            }
            asyncio.run(_destroy_all(api, label.replace("_", "-"), ids))
    print(json.dumps(results, indent=2))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "spine.json").write_text(json.dumps({"machine": machine_line(), **results}, indent=2))
