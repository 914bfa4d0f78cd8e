"""Creates with an ``Idempotency-Key`` against creates without one, on one cluster in one run:
what the key's turn across brokers costs (its entry created, then written with the worker
that made the machine, in JetStream's ``souq-idempotency``; docs/protocol.md), and the offers
a keyed create asks where an unkeyed one draws from the broker's book.

One region of two workers, one broker; ``KEYED_ROUNDS`` rounds of ``KEYED_BLOCK`` creates each
way, alternating (``skip_launch``: the placement, not the spawn), timed at the client, and the
broker's CPU (user + system, ``/proc``) summed per way. A third way, *retried*, sends each
keyed create's key again: it claims where the key's entry says the machine is."""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psutil

from bench.stats import machine_line, summary_ms
from souq.testing import Cluster, auth_headers

REGION = "keyed"
ROUNDS = int(os.environ.get("KEYED_ROUNDS", "6"))
BLOCK = int(os.environ.get("KEYED_BLOCK", "50"))
WARMUP = 20
BODY = {
    "region": REGION,
    "skip_launch": True,
    "config": {"cmd": ["sleep", "600"], "guest": {"cpus": 0.001, "memory_mb": 1}},
}


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def _block(
    http: httpx.Client, app: str, broker: psutil.Process, keys: list[str | None]
) -> tuple[list[float], float]:
    """Create one machine per key (None: no key); the times and the broker's CPU for them."""
    took: list[float] = []
    cpu0 = _cpu(broker)
    for key in keys:
        headers = {"Idempotency-Key": key} if key else {}
        t0 = time.perf_counter()
        r = http.post(f"/v1/apps/{app}/machines", json=BODY, headers=headers)
        took.append(time.perf_counter() - t0)
        assert r.status_code in (200, 201), r.text
    return took, _cpu(broker) - cpu0


def main() -> dict[str, object]:
    with (
        tempfile.TemporaryDirectory(prefix="souq-bench-keyed-") as tmp,
        Cluster(Path(tmp), regions={REGION: 2}, cpus=64, memory_mb=65536) as cluster,
    ):
        cluster.wait_for_workers()
        broker = psutil.Process(cluster.brokers[0].pid)
        app = "keyed" + uuid.uuid4().hex[:6]
        times: dict[str, list[float]] = {"unkeyed": [], "keyed": [], "retried": []}
        cpu = dict.fromkeys(times, 0.0)
        with httpx.Client(base_url=cluster.brokers[0].url, headers=auth_headers()) as http:
            _block(http, app, broker, [None] * WARMUP)
            _block(http, app, broker, [uuid.uuid4().hex for _ in range(WARMUP)])
            for round_ in range(ROUNDS):
                keys = [uuid.uuid4().hex for _ in range(BLOCK)]
                first: list[tuple[str, list[str | None]]] = [
                    ("unkeyed", [None] * BLOCK),
                    ("keyed", list(keys)),
                ]
                # the order alternating round by round; a retry after its first
                retried: tuple[str, list[str | None]] = ("retried", list(keys))
                ways = [*(first if round_ % 2 == 0 else first[::-1]), retried]
                for name, block_keys in ways:
                    took, used = _block(http, app, broker, block_keys)
                    times[name] += took
                    cpu[name] += used
    out: dict[str, object] = {"machine": machine_line(), "rounds": ROUNDS, "block": BLOCK}
    for name, values in times.items():
        out[name] = {**summary_ms(values), "broker_cpu_ms": round(cpu[name] / len(values) * 1e3, 3)}
    unkeyed = out["unkeyed"]
    keyed = out["keyed"]
    assert isinstance(unkeyed, dict) and isinstance(keyed, dict)
    out["keyed_over_unkeyed_p50"] = round(keyed["p50"] / unkeyed["p50"], 2)
    out["keyed_cpu_over_unkeyed"] = round(keyed["broker_cpu_ms"] / unkeyed["broker_cpu_ms"], 2)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
