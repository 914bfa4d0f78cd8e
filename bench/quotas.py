"""What a quota check adds to a create: single creates through one broker, driven by ``wrk``
as :mod:`bench.creates` drives them, on one stack (nats-server, ``souq fleet`` of hollow
workers, one broker), side by side in one run:

* ``none``: an app without a quota (a create reads the app's and its org's quota keys: none);
* ``app``: an app with a quota set (limits far above what the run makes), so that every create
  reserves on its key before it claims and settles after (two compare-and-sets);
* ``app_and_org``: the same app in an organization that has a quota too (four, the two
  scopes at once);
* ``app_classes``: an app whose quota has a line per class too (the create checked against its
  class's line and the all-classes line, in the same compare-and-sets as ``app``).

Each figure: creates per second, latency, and the broker's and nats-server's CPU per create.
The runs alternate (none, app, app_and_org, app_classes, twice) so that a drift of the host
shows; the ledger of a scope grows with its machines, so each run's machine count is reported
with it.

Suite ``quotas`` (``python -m bench quotas``); ``QUOTAS_DURATION_S`` (default 5) and
``QUOTAS_WORKERS`` (default 100) change the run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.creates import CONFIG, REGION, SINGLE_CONNECTIONS, _drive, _stack
from bench.stats import machine_line

__all__ = ["main", "quotas"]

BIG = {"cpus": 1e9, "memory_mb": 10**12, "machines": 10**9}
BIG_CLASSES = {
    **BIG,
    "volume_gb": 10**9,
    "classes": dict.fromkeys(("reserved", "standard", "spot"), BIG),
}
CASES = ("none", "app", "app_and_org", "app_classes")


def _one(stack: Any, root: Path, app: str, duration_s: int) -> dict[str, Any]:
    body = {"region": REGION, "config": CONFIG}
    path = f"/v1/apps/{app}/machines"
    target = (stack.broker.url, stack.token, stack.pids())
    result = _drive(target, root, path, body, SINGLE_CONNECTIONS, f"single-{app}", duration_s)
    result["creates_per_s"] = result.pop("ok_per_s")
    return result


def quotas() -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: `make bench` installs it (apt-get install wrk)")
    duration_s = int(os.environ.get("QUOTAS_DURATION_S", "5"))
    workers = int(os.environ.get("QUOTAS_WORKERS", "100"))
    print(f"# quotas benchmark — one broker, wrk — {machine_line()}", flush=True)
    results: dict[str, Any] = {"duration_s": duration_s, "workers": workers, "runs": []}
    with (
        tempfile.TemporaryDirectory(prefix="souq-bench-") as tmp,
        _stack(Path(tmp) / "stack", workers, secured=True) as stack,
    ):
        headers = {"Authorization": f"Bearer {stack.token}"}
        url = stack.broker.url
        apps = {"none": "plain", "app": "quotaed", "app_and_org": "orged", "app_classes": "classed"}
        r = httpx.post(
            f"{url}/v1/apps", json={"name": "orged", "org_slug": "benchorg"}, headers=headers
        )
        r.raise_for_status()
        for name in ("quotaed", "orged"):
            httpx.put(f"{url}/v1/apps/{name}/quota", json=BIG, headers=headers).raise_for_status()
        quota = f"{url}/v1/apps/classed/quota"
        httpx.put(quota, json=BIG_CLASSES, headers=headers).raise_for_status()
        httpx.put(f"{url}/v1/orgs/benchorg/quota", json=BIG, headers=headers).raise_for_status()
        for round_ in range(2):
            for case, app in apps.items():
                run = _one(stack, Path(tmp), app, duration_s)
                made = httpx.get(f"{url}/v1/apps/{app}/quota", headers=headers).json()
                run = {
                    "case": case,
                    "round": round_,
                    "app_machines": made["use"]["machines"],
                    **run,
                }
                results["runs"].append(run)
                print(case, json.dumps(run), flush=True)
    summary: dict[str, Any] = {}
    for case in CASES:
        runs = [r for r in results["runs"] if r["case"] == case]
        summary[case] = {
            "creates_per_s": round(sum(r["creates_per_s"] for r in runs) / len(runs), 1),
            "p50_ms": round(sum(r["latency_ms"]["p50"] for r in runs) / len(runs), 2),
            "broker_cpu_ms_per_create": round(
                sum(r["cpu_ms_per_ok_request"]["broker"] for r in runs) / len(runs), 2
            ),
            "broker_cpu_ms_per_create_net_of_idle": round(
                sum(r["cpu_ms_per_ok_request_net_of_idle"]["broker"] for r in runs) / len(runs), 2
            ),
            "host_busy_pct": round(sum(r["host_busy_pct"] for r in runs) / len(runs), 1),
            "nats_cpu_ms_per_create": round(
                sum(r["cpu_ms_per_ok_request"]["nats-server"] for r in runs) / len(runs), 2
            ),
        }
    none = summary["none"]
    for case in CASES[1:]:
        summary[case]["rate_vs_none"] = round(
            summary[case]["creates_per_s"] / none["creates_per_s"], 3
        )
        summary[case]["broker_cpu_vs_none"] = round(
            summary[case]["broker_cpu_ms_per_create"] / none["broker_cpu_ms_per_create"], 3
        )
    results["summary"] = summary
    print(json.dumps(summary, indent=2))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "quotas.json").write_text(json.dumps({"machine": machine_line(), **results}, indent=2))


def main() -> None:
    quotas()
