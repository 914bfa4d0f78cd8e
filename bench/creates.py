"""Creates through one broker, driven by ``wrk``: single creates per second against 100, 1,000
and 5,000 hollow workers, batch creates at 1,000, and the spine's create→started, in one run.

Suite ``creates`` (``python -m bench creates``). For each fleet size: a fresh nats-server, one
``souq fleet`` process of that many hollow workers (64 cpus and 256 GiB each, so capacity never
runs out) and one ``souq broker`` process, all torn down before the next size. The load comes
from ``wrk`` (C, 2 threads), not from this process: 32 connections ``POST
/v1/apps/bench/machines``, a 2 s warm-up whose figures are discarded, then the timed run (10 s).
Batch creates (``POST /v1/apps/bench/machines/batch``, ``count: 100``) use 8 connections, the
broker's ``batch_concurrency``, on a fresh 1,000-worker stack. Every machine is started (hollow:
the driver starts nothing). ``wrk``'s Lua script counts the answers by status (and error code)
and prints one JSON line at the end; the CPU each process used during the timed run is read
from the kernel (psutil for the daemons, ``getrusage`` of the reaped ``wrk``).

The cluster is run as a user runs it (``CREATES_SECURED=0`` for an open one): NATS users by
nkey, API tokens and the audit log, as ``souq cluster init`` makes it. Beside the singles at
1,000 workers, the CPU skeleton (:func:`bench.skeleton.cpu_stack`: the same route and token
check, one NATS request to a worker that answers at once) is driven the same way, and each
process's CPU per create is set against its skeleton's per request.

Then create→started, as the ``spine`` suite measures it (real agents, real processes), beside
its floor and its skeleton.

``CREATES_DURATION_S`` (default 10) and ``CREATES_FLEETS`` (default ``100,1000,5000``) change the
run; ``CREATES_SPINE=0`` leaves out create→started. ``CREATES_PROFILE=DIR``: after the timed
singles at 1,000 workers, one more run of the same length with ``py-spy`` sampling the broker and
the fleet (not counted in any figure), its flame graphs written to ``DIR`` as
``{broker,fleet}-single.svg`` and the collapsed stacks beside them (``.txt``).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import skeleton, spine
from bench.stats import machine_line
from souq.auth.bus import init_bus
from souq.auth.files import AuthDir
from souq.natsserver import NatsServer
from souq.testing import BrokerProcess, FleetProcess, environment, wait_until

REGION = "bench"
APP = "bench"
CONFIG = {"cmd": ["sleep", "3600"], "guest": {"cpus": 0.01, "memory_mb": 1}}
FLEETS = (100, 1000, 5000)
BATCH_FLEET = 1000
SKELETON_FLEET = 1000  # the fleet size whose singles the CPU skeleton is set beside
BATCH = 100
THREADS = 2
IDLE_S = 3.0  # how long each process's idle CPU is measured before a run
SINGLE_CONNECTIONS = 32
BATCH_CONNECTIONS = 8
DURATION_S = 10
WARMUP_S = 2
WORKER_CPUS = 64
WORKER_MEMORY_MB = 262_144
MARK = "CREATES_JSON "

# wrk runs one Lua state per thread and another for setup() and done(); done() gathers each
# thread's counts with thread:get(). Answers are counted by status, and by the error's stable
# code (`409 insufficient_capacity`) when there is one. For batches, `placed` is summed from the
# answers (it is the answer's second field, so the first match is the batch's own).
LUA = r"""
wrk.method = "POST"
wrk.body = [==[BODY]==]
wrk.headers["Content-Type"] = "application/json"
if "TOKEN" ~= "" then wrk.headers["Authorization"] = "Bearer TOKEN" end

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  statuses = {}
  placed = 0
  batch = args[1] == "batch"
end

function response(status, headers, body)
  local key = tostring(status)
  if status >= 300 then
    key = key .. " " .. (string.match(body, '"status"%s*:%s*"([%w_]+)"') or "?")
  elseif batch then
    placed = placed + (tonumber(string.match(body, '"placed"%s*:%s*(%d+)')) or 0)
  end
  statuses[key] = (statuses[key] or 0) + 1
end

function done(summary, latency, requests)
  local statuses, placed = {}, 0
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("statuses")) do
      statuses[k] = (statuses[k] or 0) + v
    end
    placed = placed + t:get("placed")
  end
  local parts = {}
  for k, v in pairs(statuses) do
    table.insert(parts, string.format('"%s": %.0f', k, v))
  end
  local e = summary.errors
  io.write(string.format(
    'MARK{"requests": %.0f, "duration_us": %.0f, "placed": %.0f, "statuses": {%s}, ' ..
    '"socket_errors": {"connect": %.0f, "read": %.0f, "write": %.0f, "timeout": %.0f}, ' ..
    '"wrk_non_2xx_3xx": %.0f, "latency_us": {"p50": %.0f, "p90": %.0f, "p99": %.0f, ' ..
    '"mean": %.1f, "max": %.0f}}\n',
    summary.requests, summary.duration, placed, table.concat(parts, ", "),
    e.connect, e.read, e.write, e.timeout, e.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max))
end
"""


@dataclass
class Stack:
    nats: NatsServer
    fleet: FleetProcess
    broker: BrokerProcess
    fleet_start_s: float
    token: str = ""  # the admin token of a secured stack ("": an open one)

    def pids(self) -> dict[str, int]:
        out = {"broker": self.broker.process, "fleet": self.fleet.process}
        out["nats-server"] = self.nats.process
        return {name: proc.pid for name, proc in out.items() if proc is not None}


@contextlib.contextmanager
def _stack(root: Path, workers: int, *, secured: bool = False) -> Iterator[Stack]:
    """A fresh nats-server, ``souq fleet`` of ``workers`` and one broker that sees them all;
    everything stopped on the way out, started or not. ``secured``: as ``souq cluster init``
    makes a cluster (NATS users by nkey, API tokens, the audit log)."""
    root.mkdir(parents=True)
    auth = AuthDir.create(root / "auth") if secured else None
    if auth is not None:
        init_bus(auth)
    env = {"SOUQ_AUTH_DIR": str(auth.path)} if auth is not None else {}
    token = auth.admin() if auth is not None else ""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    config = auth.nats_conf if auth is not None else None
    with NatsServer(store_dir=root / "nats", config=config) as nats, environment(**env):
        fleet = FleetProcess(
            nats_url=nats.url,
            region=REGION,
            workers=workers,
            cpus=WORKER_CPUS,
            memory_mb=WORKER_MEMORY_MB,
            log_path=root / "fleet.log",
        )
        broker = BrokerProcess(nats_url=nats.url, log_path=root / "broker.log")
        try:
            t0 = time.perf_counter()
            fleet.start(timeout=300)
            fleet_start_s = time.perf_counter() - t0
            broker.start()

            def ready() -> bool:
                answer = httpx.get(broker.url + "/healthz", timeout=10, headers=headers)
                return bool(answer.json()["workers"] >= workers)

            def synced() -> bool:
                # Its cluster view has compared every worker once: lists come from the view.
                # (A broker's first round under load re-lists the workers that have events in
                # flight, a start-up cost the timed run should not carry.)
                r = httpx.get(f"{broker.url}/v1/apps/{APP}/machines", timeout=10, headers=headers)
                return r.headers.get("X-Souq-View") == "view"

            wait_until(ready, timeout=120, interval=0.2, message="the broker to see the fleet")
            wait_until(synced, timeout=120, interval=0.2, message="the broker's view to sync")
            yield Stack(nats, fleet, broker, round(fleet_start_s, 1), token)
        finally:
            broker.stop()
            fleet.stop(timeout=120)


def _cpu_s(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        times = psutil.Process(pid).cpu_times()
        out[name] = times.user + times.system
    return out


def _idle_cpu_per_s(pids: dict[str, int], seconds: float = IDLE_S) -> dict[str, float]:
    """Each process's CPU seconds per second while nothing is asked of it."""
    before = _cpu_s(pids)
    time.sleep(seconds)  # a measuring window, not a wait for anything
    after = _cpu_s(pids)
    return {name: (after[name] - before[name]) / seconds for name in pids}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _total(t: Any) -> float:
    return float(sum(t) - getattr(t, "guest", 0) - getattr(t, "guest_nice", 0))


def _idle(t: Any) -> float:
    return float(t.idle + getattr(t, "iowait", 0) + getattr(t, "steal", 0))


def _wrk(
    url: str, script: Path, connections: int, duration_s: int, mode: str
) -> tuple[dict[str, Any], float, float]:
    """One ``wrk`` run: its JSON line, its wall time and the CPU it used (the children's
    rusage grows by exactly that of ``wrk`` when it is reaped: nothing else exits meanwhile)."""
    cmd = ["wrk", "-t", str(THREADS), "-c", str(connections), "-d", f"{duration_s}s"]
    cmd += ["--timeout", "60s", "-s", str(script), url, "--", mode]
    cpu0 = _children_cpu_s()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 90, check=False)
    wall = time.perf_counter() - t0
    cpu = _children_cpu_s() - cpu0
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr}")
    return json.loads(lines[-1][len(MARK) :]), wall, cpu


def _drive(
    target: tuple[str, str, dict[str, int]],
    root: Path,
    path: str,
    body: dict[str, object],
    connections: int,
    mode: str,
    duration_s: int,
) -> dict[str, Any]:
    """A warm-up run (discarded), then the timed run, with each process's CPU over it.
    ``target``: the base URL, the token to send ("": none) and the processes to measure."""
    base, token, pids = target
    script = root / f"{mode}.lua"
    lua = LUA.replace("BODY", json.dumps(body)).replace("MARK", MARK)
    script.write_text(lua.replace("TOKEN", token))
    url = base + path
    idle = _idle_cpu_per_s(pids)
    _wrk(url, script, connections, WARMUP_S, mode)
    before = _cpu_s(pids)
    host0 = psutil.cpu_times()
    out, wall, wrk_cpu = _wrk(url, script, connections, duration_s, mode)
    host1 = psutil.cpu_times()
    after = _cpu_s(pids)

    requests: int = out["requests"]
    seconds: float = out["duration_us"] / 1e6
    statuses: dict[str, int] = out["statuses"]
    ok = sum(n for code, n in statuses.items() if code.startswith("2"))
    cpu = {name: after[name] - before[name] for name in pids}
    cpu["wrk"] = wrk_cpu
    # Linux counts guest time inside user time too; steal is the hypervisor's, not ours.
    host_total = _total(host1) - _total(host0)
    host_idle = _idle(host1) - _idle(host0)
    # The rest of the host's busy time: this process, the kernel's threads, and anything else
    # running on the machine (a figure well above a few % means the run was not alone).
    cpu["other"] = max(0.0, host_total - host_idle - sum(cpu.values()))
    latency: dict[str, float] = out["latency_us"]
    return {
        "connections": connections,
        "threads": THREADS,
        "duration_s": round(seconds, 2),
        "requests": requests,
        "ok": ok,
        "non_2xx": requests - ok,
        "statuses": statuses,
        "socket_errors": out["socket_errors"],
        "wrk_non_2xx_3xx": out["wrk_non_2xx_3xx"],
        "requests_per_s": round(requests / seconds, 1),
        "ok_per_s": round(ok / seconds, 1),
        "placed": out["placed"],
        "latency_ms": {k: round(v / 1000, 2) for k, v in latency.items()},
        "cpu_pct_of_one_core": {k: round(100 * v / wall, 1) for k, v in cpu.items()},
        "cpu_ms_per_ok_request": {k: round(1000 * v / max(ok, 1), 2) for k, v in cpu.items()},
        # What each process burns with no request at all (heartbeats, the view's rounds, the
        # fleet's pacing), and its CPU per create net of that: the figure the load changes.
        "idle_cpu_pct_of_one_core": {k: round(100 * v, 1) for k, v in idle.items()},
        "cpu_ms_per_ok_request_net_of_idle": {
            k: round(1000 * max(0.0, cpu[k] - idle[k] * wall) / max(ok, 1), 2) for k in idle
        },
        "host_busy_pct": round(100 * (1 - host_idle / host_total), 1),
        "rss_mb": {
            name: round(psutil.Process(pid).memory_info().rss / 2**20, 1)
            for name, pid in pids.items()
        },
    }


def singles(
    root: Path,
    workers: int,
    duration_s: int,
    *,
    secured: bool = False,
    profile: Path | None = None,
) -> dict[str, Any]:
    body = {"region": REGION, "config": CONFIG}
    with _stack(root, workers, secured=secured) as stack:
        path = f"/v1/apps/{APP}/machines"
        target = (stack.broker.url, stack.token, stack.pids())
        result = _drive(target, root, path, body, SINGLE_CONNECTIONS, "single", duration_s)
        if profile is not None:
            sampled = {k: v for k, v in stack.pids().items() if k != "nats-server"}
            with _sampling(sampled, profile, "single", duration_s):
                _wrk(stack.broker.url + path, root / "single.lua", SINGLE_CONNECTIONS,
                     duration_s, "single")  # fmt: skip
        result["creates_per_s"] = result.pop("ok_per_s")
        result["fleet_start_s"] = stack.fleet_start_s
        result["secured"] = secured
    return {"workers": workers, **result}


@contextlib.contextmanager
def _sampling(pids: dict[str, int], out: Path, mode: str, duration_s: int) -> Iterator[None]:
    """``py-spy`` sampling each process while the block runs: a flame graph (SVG) and the
    collapsed stacks (one line per stack with its count) per process, in ``out``."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for name, pid in pids.items():
        for fmt, ext in (("flamegraph", "svg"), ("raw", "txt")):
            cmd = [spy, "record", "--nonblocking", "--pid", str(pid), "--rate", "200"]
            cmd += ["--duration", str(duration_s + 1), "--format", fmt]
            cmd += ["--output", str(out / f"{name}-{mode}.{ext}")]
            quiet = subprocess.DEVNULL
            procs.append(subprocess.Popen(cmd, stdout=quiet, stderr=quiet))
    try:
        yield
    finally:
        for proc in procs:
            proc.wait(timeout=duration_s + 60)


def skeleton_singles(root: Path, workers: int, duration_s: int, *, secured: bool) -> dict[str, Any]:
    """The CPU skeleton (:func:`bench.skeleton.cpu_stack`) driven as :func:`singles` drives a
    broker: the same route, body, connections and, ``secured``, a token it checks."""
    body = {"region": REGION, "config": CONFIG}
    root.mkdir(parents=True)
    token, env = "", {}
    if secured:
        auth = AuthDir.create(root / "auth")
        token, env = auth.admin(), {"SOUQ_AUTH_DIR": str(auth.path)}
    with skeleton.cpu_stack(workers, env) as (url, pids):
        path = f"/v1/apps/{APP}/machines"
        result = _drive((url, token, pids), root, path, body, SINGLE_CONNECTIONS, "single",
                        duration_s)  # fmt: skip
    result["creates_per_s"] = result.pop("ok_per_s")
    return {"workers": workers, "secured": secured, **result}


def cpu_ratios(single: dict[str, Any], floor: dict[str, Any]) -> dict[str, float]:
    """Souq's CPU per create against the skeleton's per request, process by process (both net
    of what the process burns idle), and the rate one broker's CPU allows: one core's second over
    its CPU per create (the broker is one process; the fleet and nats-server run beside it)."""
    ours = single["cpu_ms_per_ok_request_net_of_idle"]
    its = floor["cpu_ms_per_ok_request_net_of_idle"]
    return {
        "broker / skeleton front": round(ours["broker"] / max(its["front"], 0.01), 2),
        "fleet / skeleton workers": round(ours["fleet"] / max(its["workers"], 0.01), 2),
        "nats-server / skeleton's": round(ours["nats-server"] / max(its["nats-server"], 0.01), 2),
        "creates/s / skeleton's requests/s": round(
            single["creates_per_s"] / floor["creates_per_s"], 2
        ),
        "creates/s one broker's CPU allows": round(1000 / max(ours["broker"], 0.01)),
    }


def batches(root: Path, workers: int, duration_s: int) -> dict[str, Any]:
    body = {"region": REGION, "count": BATCH, "config": CONFIG}
    with _stack(root, workers) as stack:
        path = f"/v1/apps/{APP}/machines/batch"
        target = (stack.broker.url, stack.token, stack.pids())
        result = _drive(target, root, path, body, BATCH_CONNECTIONS, "batch", duration_s)
        ok, seconds, placed = result["ok"], result["duration_s"], result["placed"]
        result["batches_per_s"] = result.pop("ok_per_s")
        result["batch"] = BATCH
        result["machines_per_s"] = round(ok * BATCH / seconds, 1)
        # min_count defaults to count: an answer of 201 placed all 100, or something is wrong.
        result["placed_matches_ok_x_batch"] = placed == ok * BATCH
        result["fleet_start_s"] = stack.fleet_start_s
    return {"workers": workers, **result}


def creates() -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: `make bench` installs it (apt-get install wrk)")
    fleets = [int(n) for n in os.environ.get("CREATES_FLEETS", "").split(",") if n] or FLEETS
    duration_s = int(os.environ.get("CREATES_DURATION_S", DURATION_S))
    secured = os.environ.get("CREATES_SECURED", "1") != "0"
    profile = Path(os.environ["CREATES_PROFILE"]) if os.environ.get("CREATES_PROFILE") else None
    print(f"# creates benchmark — one broker, wrk — {machine_line()}", flush=True)
    results: dict[str, Any] = {
        "duration_s": duration_s,
        "warmup_s": WARMUP_S,
        "config": CONFIG,
        "secured": secured,
    }
    single: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="souq-bench-") as tmp:
        mid = SKELETON_FLEET if SKELETON_FLEET in fleets else fleets[0]
        for n in fleets:
            sampled = profile if n == mid else None
            where = Path(tmp) / f"single-{n}"
            single[str(n)] = singles(where, n, duration_s, secured=secured, profile=sampled)
            print("single", n, json.dumps(single[str(n)]), flush=True)
        results["single"] = single
        floor = skeleton_singles(Path(tmp) / "skeleton", mid, duration_s, secured=secured)
        print("skeleton", mid, json.dumps(floor), flush=True)
        results["skeleton_single"] = floor
        results["cpu_per_create_vs_skeleton"] = cpu_ratios(single[str(mid)], floor)
        first, last = single[str(fleets[0])], single[str(fleets[-1])]
        ratio = last["creates_per_s"] / first["creates_per_s"]
        results[f"single_rate_ratio_{fleets[-1]}_vs_{fleets[0]}"] = round(ratio, 2)
        results["batch"] = batches(Path(tmp) / "batch", BATCH_FLEET, duration_s)
        print("batch", json.dumps(results["batch"]), flush=True)
        if os.environ.get("CREATES_SPINE", "1") != "0":
            with spine.cluster(Path(tmp) / "spine") as cluster:
                results["create_started"] = spine.create_started(cluster.api_url)
            print("create_started", json.dumps(results["create_started"]), flush=True)
    print(json.dumps(results, indent=2))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "creates.json").write_text(json.dumps({"machine": machine_line(), **results}, indent=2))


def main() -> None:
    creates()
