"""The cluster view at scale (``python -m bench view``): 1,000 hollow workers, 10,000 machines.

* **propagation** — a machine's state change (a stop through broker A, 100 a second for 12 s,
  so that two anti-entropy rounds fall inside) until it shows in broker B's view. B's event
  stream (``/v1/events?follow=true``) is read here: B appends an event to its stream in the
  same step as it applies it to its view, so the time an event reaches this process minus the
  event's own timestamp (the hollow worker's clock, same host) bounds the propagation from
  above.
* **memory** — broker B's RSS before and after the 10,000 machines, and the SQLite pages the
  view holds.
* **list latency** — ``GET /v1/apps/{app}/machines`` of a 1,000-machine app, and ``GET /v1/apps``,
  on broker B, sequentially.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.scale import _add_brokers, _batch_body, _load, _rss, _start, _stop, _write
from bench.stats import machine_line, summary_ms

APPS = 10
PER_APP = 1000
BATCH = 100
STOP_RATE = 100  # state changes a second, steadily,
STOP_SECONDS = 12  # for long enough to span two anti-entropy rounds (every 5 s)


def view(workers: int = 1000) -> None:
    print(f"# cluster view benchmark — {workers} hollow workers — {machine_line()}", flush=True)
    results: dict[str, object] = {"workers": workers, "machines": APPS * PER_APP}
    with tempfile.TemporaryDirectory(prefix="souq-bench-") as tmp:
        bench = _start(Path(tmp), workers, 1)
        _add_brokers(bench, 1)
        a, b = bench.urls
        try:
            rss_before = _rss(bench.brokers[1].process)
            created = _create(a)
            results["create"] = created
            print("create", json.dumps(created), flush=True)
            _wait_view(b, sum(created.values()))
            results["broker_b_rss_mb"] = {
                "before": rss_before,
                "after": _rss(bench.brokers[1].process),
            }
            results["view_bytes"] = _metric(b, "souq_view_bytes")
            results["propagation"] = _propagation(a, b)
            print("propagation", json.dumps(results["propagation"]), flush=True)
            results["list"] = _lists(b)
            print("list", json.dumps(results["list"]), flush=True)
        finally:
            _stop(bench)
    _write("view", results)


def _create(url: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in range(APPS):
        result = asyncio.run(
            _load(
                [url],
                f"/v1/apps/view{i}/machines/batch",
                _batch_body(BATCH),
                requests=PER_APP // BATCH,
                per_request=lambda r: int(r.json()["placed"]),
                concurrency=4,
            )
        )
        placed = result["placed"]
        assert isinstance(placed, int)
        out[f"view{i}"] = placed
    return out


def _wait_view(url: str, machines: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        apps = httpx.get(url + "/v1/apps", timeout=30).json()
        if sum(a["machines"] for a in apps) >= machines:
            return
        time.sleep(0.2)
    raise TimeoutError("broker B's view did not reach the machines created through broker A")


def _metric(url: str, name: str) -> float | None:
    text = httpx.get(url + "/metrics", timeout=30).text
    m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else None


def _propagation(a: str, b: str) -> dict[str, object]:
    """Stop machines through A, ``STOP_RATE`` a second for ``STOP_SECONDS`` (long enough to
    span two anti-entropy rounds); time each resulting event's arrival at B."""
    wanted = STOP_RATE * STOP_SECONDS
    ids: list[str] = []
    for i in range(APPS):
        if len(ids) >= wanted:
            break
        ids += [m["id"] for m in httpx.get(f"{b}/v1/apps/view{i}/machines", timeout=30).json()]
    ids = ids[:wanted]
    targets = set(ids)
    lags: list[float] = []
    seen: set[str] = set()
    ready = threading.Event()
    done = threading.Event()

    def follow() -> None:
        last = httpx.get(f"{b}/v1/events", timeout=30).text.rsplit("id: ", 1)
        since = last[1].split("\n", 1)[0] if len(last) > 1 else "0"
        url = f"{b}/v1/events?follow=true&since={since}"
        with httpx.stream("GET", url, timeout=httpx.Timeout(30, read=60)) as stream:
            ready.set()
            for line in stream.iter_lines():
                if not line.startswith("data: "):
                    continue
                now_ms = time.time() * 1000
                event = json.loads(line[6:])
                if event.get("machine_id") in targets and event["state"] == "stopped":
                    lags.append(max(0.0, now_ms - event["event"]["timestamp"]) / 1000)
                    seen.add(event["machine_id"])
                    if len(seen) >= len(ids):
                        done.set()
                        return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    ready.wait(30)
    owner = {m: f"view{n // PER_APP}" for n, m in enumerate(ids)}

    async def stops() -> None:
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            start = time.perf_counter()

            async def stop(n: int, mid: str) -> None:
                await asyncio.sleep(max(0.0, start + n / STOP_RATE - time.perf_counter()))
                await client.post(f"{a}/v1/apps/{owner[mid]}/machines/{mid}/stop")

            await asyncio.gather(*(stop(n, m) for n, m in enumerate(ids)))

    t0 = time.perf_counter()
    asyncio.run(stops())
    done.wait(60)
    return {
        "stops": len(ids),
        "rate_per_s": STOP_RATE,
        "events_seen": len(lags),
        "wall_s": round(time.perf_counter() - t0, 2),
        "lag_ms": summary_ms(lags) if lags else None,
    }


def _lists(url: str, n: int = 50) -> dict[str, object]:
    out: dict[str, object] = {}
    with httpx.Client(timeout=30) as client:
        for name, path in (
            ("app_1000_machines", "/v1/apps/view1/machines"),
            ("apps", "/v1/apps"),
        ):
            times = []
            source = ""
            for _ in range(n):
                t0 = time.perf_counter()
                r = client.get(url + path)
                times.append(time.perf_counter() - t0)
                source = r.headers.get("X-Souq-View", "")
            out[name] = {"latency_ms": summary_ms(times), "served_from": source}
    return out


def main() -> None:
    view()
