"""A burst of concurrent creates at a cluster with room for all of them: how many are placed,
refused (and why), and how many machines exist that no answer named.

``python -m bench.burst``: one broker and ``BURST_WORKERS`` (3) real agents of ``BURST_CPUS``
(4) cpus in one region, then ``BURST_CREATES`` (1,000) creates of ``BURST_SIZE`` (0.01) cpus
fired at once (httpx, one connection each), started unless ``BURST_LAUNCH=0``. Figures in
docs/benchmarks.md, "A burst of 1,000 creates".
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx

from souq.testing import Cluster, auth_headers

WORKERS = int(os.environ.get("BURST_WORKERS", "3"))
CPUS = float(os.environ.get("BURST_CPUS", "4"))
CREATES = int(os.environ.get("BURST_CREATES", "1000"))
SIZE = float(os.environ.get("BURST_SIZE", "0.01"))
LAUNCH = os.environ.get("BURST_LAUNCH", "1") != "0"


async def _burst(url: str, app: str) -> list[httpx.Response | Exception]:
    body = {
        "region": "burst",
        "skip_launch": not LAUNCH,
        "config": {"cmd": ["sleep", "600"], "guest": {"cpus": SIZE, "memory_mb": 1}},
    }
    limits = httpx.Limits(max_connections=CREATES, max_keepalive_connections=CREATES)
    async with httpx.AsyncClient(timeout=180, limits=limits) as client:

        async def one() -> httpx.Response | Exception:
            try:
                return await client.post(
                    f"{url}/v1/apps/{app}/machines", json=body, headers=auth_headers()
                )
            except httpx.HTTPError as exc:
                return exc

        return await asyncio.gather(*(one() for _ in range(CREATES)))


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="souq-burst-", dir="/var/tmp"))
    with Cluster(root, regions={"burst": WORKERS}, cpus=CPUS, memory_mb=65536) as cluster:
        app = "burst" + uuid.uuid4().hex[:8]
        started = time.monotonic()
        answers = asyncio.run(_burst(cluster.api_url, app))
        elapsed = time.monotonic() - started
        statuses: Counter[str] = Counter()
        told: set[str] = set()
        for r in answers:
            if isinstance(r, Exception):
                statuses[type(r).__name__] += 1
                continue
            body = r.json()
            statuses[f"{r.status_code} {body.get('status', '')}".strip()] += 1
            if r.status_code == 201:
                told.add(body["id"])
        workers = cluster.client().workers()
        listed = {m.id for m in cluster.client().list_machines(app)}
        print(
            json.dumps(
                {
                    "creates": CREATES,
                    "seconds": round(elapsed, 1),
                    "answers": dict(statuses),
                    "free_cpus": round(sum(w.capacity.cpus - w.allocated.cpus for w in workers), 2),
                    "machines": len(listed),
                    "unanswered_machines": len(listed - told),
                }
            )
        )


if __name__ == "__main__":
    main()
