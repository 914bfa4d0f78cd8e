"""What a quota check adds to a create: single creates through one broker, driven by ``wrk``
as :mod:`bench.creates` drives them, on one stack (nats-server, ``souq fleet`` of hollow
workers, one broker), side by side in one run:

* ``none``: an app without a quota (its organization has none either; another organization of
  the cluster has one, so the broker cannot skip the lookup of the app's organization);
* ``app``: an app with a quota set (limits far above what the run makes), so that every create
  reserves on its key before it claims and settles after (two compare-and-sets);
* ``app_and_org``: an app in an organization that has a quota too (four, the two scopes at
  once);
* ``app_classes``: an app whose quota has a line per class too (the create checked against its
  class's line and the all-classes line, in the same compare-and-sets as ``app``).

Each round makes fresh apps (created first, as a user would), so that every case's ledger
holds only the machines of its own run; each round runs the cases in another order (each in
each place in turn), and every case is set against the run without a quota of its own round:
the median of those ratios is the figure, steadier than a mean on a shared, busy host. Each
figure: creates per second, latency, and the broker's and nats-server's CPU per create.
Beside it, in this process, what the quota work alone costs a broker, apart from everything
else a create does (steadier than a difference of two busy runs): ``store_cost``, the CPU of a
create's reservation and settle through the real quota store on a nats-server of its own (32 at
once, as ``wrk`` sends them), and ``ledger_cost``, the ledger's arithmetic and encoding as a
scope holds more machines (no I/O). Each is set against the run's CPU per create without a
quota.

And ``path_cost``: the broker's whole quota path of a create (``Quotas.counting``: the entry,
the scopes, the reservation and the settle through the store), per case, in this process —
the figure a busy host blurs least. ``QUOTAS_PATH_ONLY=1`` runs that part alone.

Suite ``quotas`` (``python -m bench quotas``); ``QUOTAS_DURATION_S`` (default 5),
``QUOTAS_ROUNDS`` (default 8) and ``QUOTAS_WORKERS`` (default 100) change the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx

from bench.creates import CONFIG, REGION, SINGLE_CONNECTIONS, _drive, _stack
from bench.stats import machine_line
from souq.broker.quota_store import QuotaStore
from souq.bus.nats import connect
from souq.model.quota import (
    QuotaEntry,
    QuotaLimits,
    QuotaRecord,
    QuotaUse,
    encoded,
    excess,
    held,
    reserved,
)
from souq.natsserver import NatsServer

__all__ = ["ledger_cost", "main", "path_cost", "path_costs", "quotas", "store_cost"]

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


def _apps_of_round(url: str, headers: dict[str, str], round_: int) -> dict[str, str]:
    """Fresh apps for one round, each case's quota set as it needs."""
    apps = {case: f"{case.replace('_', '-')}-{round_}" for case in CASES}
    org = f"benchorg{round_}"
    for case, app in apps.items():
        body = {"app_name": app, "org_slug": org if case == "app_and_org" else "personal"}
        httpx.post(f"{url}/v1/apps", json=body, headers=headers).raise_for_status()
    for case in ("app", "app_and_org"):
        quota = f"{url}/v1/apps/{apps[case]}/quota"
        httpx.put(quota, json=BIG, headers=headers).raise_for_status()
    quota = f"{url}/v1/apps/{apps['app_classes']}/quota"
    httpx.put(quota, json=BIG_CLASSES, headers=headers).raise_for_status()
    httpx.put(f"{url}/v1/orgs/{org}/quota", json=BIG, headers=headers).raise_for_status()
    return apps


def ledger_cost(sizes: tuple[int, ...] = (100, 1_000, 4_000, 16_000)) -> dict[str, float]:
    """CPU (ms) of one create's ledger work — the check, the reservation, the settle and the
    two records written — against a scope already holding N machines, in this process."""
    out: dict[str, float] = {}
    use = QuotaUse(cpus=1, memory_mb=256, machines=1)
    for size in sizes:
        machines = {f"m{i:014x}": (1.0, 256, "standard") for i in range(size)}
        record = QuotaRecord(
            scope="app", name="x", limits=QuotaLimits(machines=10**9), held=machines
        )
        encoded(record)  # as after the broker's first write of it
        entry = QuotaEntry(app="x", request_id="r", use=use, deadline_ms=0)
        n = 200
        t0 = time.process_time()
        for _ in range(n):
            assert excess(record, use, "standard") is None
            taken = reserved(record, entry)
            encoded(taken)
            encoded(held(taken, "r", {"m-new": use}))
        out[str(size)] = round(1000 * (time.process_time() - t0) / n, 3)
    return out


def store_cost(creates: int = 4_000, at_once: int = 32) -> dict[str, float]:
    """CPU (ms, this process: the store and its NATS client, as in a broker) of one create's
    quota work — a reservation then a settle, each a change of the scope's key — with
    ``at_once`` creates under way at a time, against a nats-server of its own."""
    use = QuotaUse(cpus=1, memory_mb=256, machines=1)

    async def run(url: str) -> dict[str, float]:
        bus = await connect(url, name="bench-quotas")
        store = await QuotaStore.open(bus.client)

        async def start(_: QuotaRecord | None) -> QuotaRecord:
            return QuotaRecord(scope="app", name="x", limits=QuotaLimits(machines=10**9))

        await store.change("app.x", start)

        async def one(i: int) -> None:
            entry = QuotaEntry(app="x", request_id=f"r{i}", use=use, deadline_ms=10**15)

            async def reserve(record: QuotaRecord | None) -> QuotaRecord | None:
                assert record is not None and excess(record, use) is None
                return reserved(record, entry)

            async def settle(record: QuotaRecord | None) -> QuotaRecord | None:
                assert record is not None
                return held(record, f"r{i}", {f"m{i:014x}": use})

            await store.change("app.x", reserve)
            await store.change("app.x", settle)

        t0 = time.process_time()
        for start_at in range(0, creates, at_once):
            await asyncio.gather(*(one(i) for i in range(start_at, start_at + at_once)))
        cpu = time.process_time() - t0
        await bus.close()
        return {
            "cpu_ms_per_create": round(1000 * cpu / creates, 3),
            "writes_per_create": round(store.writes / creates, 3),
            "reads_per_create": round(store.reads / creates, 3),
            "machines_at_end": creates,
        }

    with (
        tempfile.TemporaryDirectory(prefix="souq-bench-nats-") as tmp,
        NatsServer(store_dir=Path(tmp)) as nats,
    ):
        return asyncio.run(run(nats.url))


def path_cost(case: str, creates: int = 3_000, at_once: int = 32) -> float:
    """CPU (ms, this process) of the broker's whole quota path of one create — the
    reservation and the settle of :meth:`souq.broker.quotas.Quotas.counting` on the scopes of
    ``case`` (a :data:`CASES` name), through the real quota store on a nats-server of its own,
    ``at_once`` creates under way at a time, the ledger growing to ``creates`` machines: what a
    broker does for a quota beyond what a create does without one (nothing else of the create
    runs)."""
    from souq.broker.quotas import Quotas
    from souq.clock import SystemClock
    from souq.model import Machine
    from souq.model.machine import MachineConfig

    config = MachineConfig.model_validate(CONFIG)
    limits = QuotaLimits.model_validate_json(
        json.dumps(BIG_CLASSES if case == "app_classes" else BIG)
    )

    async def run(url: str) -> float:
        bus = await connect(url, name="bench-quotas")
        quotas = Quotas(
            lambda: bus.client,
            SystemClock(),
            deadline_s=120,
            view=None,  # type: ignore[arg-type]  # read only to reconcile: never here
            live_rows=None,  # type: ignore[arg-type]
            volumes=None,  # type: ignore[arg-type]
        )
        quotas.start()
        store = await QuotaStore.open(bus.client)
        org = "benchorg" if case == "app_and_org" else "personal"
        # none: another organization has a quota (the broker looks up the app's).
        keys = {"none": ["org.other"], "app_and_org": ["app.a", "org.benchorg"]}.get(
            case, ["app.a"]
        )
        for key in keys:
            scope, name = key.split(".")

            async def start(_: QuotaRecord | None, s: str = scope, n: str = name) -> QuotaRecord:
                return QuotaRecord(scope=s, name=n, limits=limits)  # type: ignore[arg-type]

            await store.change(key, start)
        quotas._orgs["a"] = (org, time.monotonic() + 10**6)  # as a create's read of the app
        while not quotas.scopes.known or len(quotas.scopes.keys) < len(keys):
            await asyncio.sleep(0.01)

        async def one(i: int) -> None:
            async with quotas.counting("a", f"r{i}", config) as made:
                # What settling reads of a machine (a record costs more than the path itself).
                made.append(cast(Machine, SimpleNamespace(id=f"m{i:014x}", config=config)))

        await asyncio.gather(*(one(i) for i in range(-at_once, 0)))  # warm
        t0 = time.process_time()
        for start_at in range(0, creates, at_once):
            await asyncio.gather(*(one(i) for i in range(start_at, start_at + at_once)))
        cpu = time.process_time() - t0
        with contextlib.suppress(TimeoutError):  # (the scopes' watch may linger: not timed)
            await asyncio.wait_for(quotas.close(), 5)
        await bus.close()
        return round(1000 * cpu / creates, 3)

    with (
        tempfile.TemporaryDirectory(prefix="souq-bench-nats-") as tmp,
        NatsServer(store_dir=Path(tmp)) as nats,
    ):
        return asyncio.run(run(nats.url))


def path_costs(repeats: int = 3) -> dict[str, float]:
    """:func:`path_cost` of each case, the least of ``repeats`` runs interleaved (the CPU a
    busy host adds only ever adds)."""
    runs: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(repeats):
        for case in CASES:
            runs[case].append(path_cost(case))
    return {case: min(values) for case, values in runs.items()}


def quotas() -> None:
    if os.environ.get("QUOTAS_PATH_ONLY") == "1":
        print(f"# quota path — {machine_line()}", flush=True)
        print("path_cost_ms_per_create", json.dumps(path_costs()), flush=True)
        return
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: `make bench` installs it (apt-get install wrk)")
    duration_s = int(os.environ.get("QUOTAS_DURATION_S", "5"))
    rounds = int(os.environ.get("QUOTAS_ROUNDS", "8"))
    workers = int(os.environ.get("QUOTAS_WORKERS", "100"))
    print(f"# quotas benchmark — one broker, wrk — {machine_line()}", flush=True)
    results: dict[str, Any] = {"duration_s": duration_s, "workers": workers, "runs": []}
    with (
        tempfile.TemporaryDirectory(prefix="souq-bench-") as tmp,
        _stack(Path(tmp) / "stack", workers, secured=True) as stack,
    ):
        headers = {"Authorization": f"Bearer {stack.token}"}
        url = stack.broker.url
        for round_ in range(rounds):
            apps = _apps_of_round(url, headers, round_)
            shift = round_ % len(CASES)  # each case in each place of the round in turn
            order = CASES[shift:] + CASES[:shift]
            for case in order:
                app = apps[case]
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
    results["summary"] = _summary(results["runs"])
    results["ledger_cost_ms_per_create"] = ledger_cost()
    none_cpu = results["summary"]["none"]["broker_cpu_ms_per_create"]
    results["store_cost"] = {}
    for at_once, creates in ((32, 4_000), (1, 1_000)):
        cost = store_cost(creates, at_once)
        cost["vs_create_without_quota"] = round(cost["cpu_ms_per_create"] / none_cpu, 3)
        results["store_cost"][f"at_once_{at_once}"] = cost
    print("store_cost", json.dumps(results["store_cost"]))
    paths = path_costs()
    results["path_cost"] = {
        case: {"cpu_ms_per_create": cpu, "vs_create_without_quota": round(cpu / none_cpu, 3)}
        for case, cpu in paths.items()
    }
    print("path_cost", json.dumps(results["path_cost"]))
    print(json.dumps(results["summary"], indent=2))
    print("ledger_cost_ms_per_create", json.dumps(results["ledger_cost_ms_per_create"]))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "quotas.json").write_text(json.dumps({"machine": machine_line(), **results}, indent=2))


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for case in CASES:
        mine = [r for r in runs if r["case"] == case]
        summary[case] = {
            "creates_per_s": round(statistics.mean(r["creates_per_s"] for r in mine), 1),
            "p50_ms": round(statistics.mean(r["latency_ms"]["p50"] for r in mine), 2),
            "broker_cpu_ms_per_create": round(
                statistics.mean(r["cpu_ms_per_ok_request"]["broker"] for r in mine), 3
            ),
            "broker_cpu_ms_per_create_net_of_idle": round(
                statistics.mean(r["cpu_ms_per_ok_request_net_of_idle"]["broker"] for r in mine), 3
            ),
            "nats_cpu_ms_per_create": round(
                statistics.mean(r["cpu_ms_per_ok_request"]["nats-server"] for r in mine), 3
            ),
            "machines_in_scope": round(statistics.mean(r["app_machines"] for r in mine)),
            "host_busy_pct": round(statistics.mean(r["host_busy_pct"] for r in mine), 1),
        }
    none = summary["none"]
    for case in CASES[1:]:
        # Per round against that round's own run without a quota, then the median of rounds.
        cpu = [
            r["cpu_ms_per_ok_request"]["broker"] / n["cpu_ms_per_ok_request"]["broker"]
            for r in runs
            if r["case"] == case
            for n in runs
            if n["case"] == "none" and n["round"] == r["round"]
        ]
        rate = [
            r["creates_per_s"] / n["creates_per_s"]
            for r in runs
            if r["case"] == case
            for n in runs
            if n["case"] == "none" and n["round"] == r["round"]
        ]
        summary[case]["broker_cpu_vs_none"] = round(
            summary[case]["broker_cpu_ms_per_create"] / none["broker_cpu_ms_per_create"], 3
        )
        summary[case]["broker_cpu_vs_none_median_of_rounds"] = round(statistics.median(cpu), 3)
        summary[case]["broker_cpu_vs_none_range"] = [round(min(cpu), 3), round(max(cpu), 3)]
        summary[case]["rate_vs_none"] = round(
            summary[case]["creates_per_s"] / none["creates_per_s"], 3
        )
        summary[case]["rate_vs_none_median_of_rounds"] = round(statistics.median(rate), 3)
    return summary


def main() -> None:
    quotas()
