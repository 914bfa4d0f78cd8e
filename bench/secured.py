"""What security costs a create: the same stack, open and secured, alternated, in one run.

Suite ``secured`` (``python -m bench secured``): single creates through one broker against 1,000
hollow workers, driven by ``wrk`` as the ``creates`` suite drives them, ``SECURED_ROUNDS``
(default 3) times each way, alternated (open, secured, open, ...) so that the machine's drift
falls on both. *Secured* is what ``souq cluster init`` makes: NATS users by nkey with allow
lists (the fleet and the broker each with their own), a bearer token on every request (checked
and authorized by the broker), every create recorded in the audit log (JetStream). The ratio is
the secured median over the open one.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.creates import singles
from bench.stats import machine_line

WORKERS = 1000
ROUNDS = 3
DURATION_S = 5


def run(rounds: int, duration_s: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"open": [], "secured": []}
    cpu: dict[str, list[float]] = {"open": [], "secured": []}
    with tempfile.TemporaryDirectory(prefix="souq-bench-secured-") as tmp:
        for i in range(rounds):
            for mode in ("open", "secured"):
                root = Path(tmp) / f"{mode}-{i}"
                result = singles(root, WORKERS, duration_s, secured=mode == "secured")
                assert result["non_2xx"] == 0, result["statuses"]
                rates[mode].append(result["creates_per_s"])
                cpu[mode].append(result["cpu_ms_per_ok_request"]["broker"])
                print(mode, i, result["creates_per_s"], flush=True)
    p50 = {m: statistics.median(v) for m, v in rates.items()}
    broker_cpu = {m: statistics.median(v) for m, v in cpu.items()}
    return {
        "workers": WORKERS,
        "rounds": rounds,
        "duration_s": duration_s,
        "creates_per_s": rates,
        "creates_per_s_p50": p50,
        "ratio_secured_vs_open": round(p50["secured"] / p50["open"], 2),
        "broker_cpu_ms_per_create_p50": broker_cpu,
    }


def main() -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: `make bench` installs it (apt-get install wrk)")
    rounds = int(os.environ.get("SECURED_ROUNDS", ROUNDS))
    duration_s = int(os.environ.get("SECURED_DURATION_S", DURATION_S))
    print(f"# secured creates against open ones — {machine_line()}", flush=True)
    results = {"command": "python -m bench secured", "machine": machine_line()}
    results |= run(rounds, duration_s)
    print(json.dumps(results, indent=2))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "secured.json").write_text(json.dumps(results, indent=2) + "\n")
