"""The proxy's data plane against nginx (``python -m bench proxy``): throughput at 64 connections
and the latency each adds at one connection, side by side in one run on this host.

Behind every proxy the same backend: **nginx itself answering a fixed 200** (23 bytes, one
worker, its own instance and configuration), so that the backend costs as little as anything
could. In front of it, each on its own port:

* ``nginx``: a second nginx instance as a reverse proxy, ``worker_processes auto`` (one worker
  per core), HTTP/1.1 to the backend through an ``upstream`` with ``keepalive 128``, setting
  ``Host`` and the ``X-Forwarded-*`` headers as the Souq relay does;
* ``souq``: one relay process (:class:`souq.proxy.Relay` over a table holding the backend as
  the one machine of app ``bench``, limits raised to 10,000 so that nothing queues);
* ``souq x2``: two relay processes sharing one port with ``SO_REUSEPORT``;
* ``souq tcp``: one relay process whose port is a raw TCP service (:meth:`Relay.listen_tcp`):
  bytes piped to the backend, no HTTP read at all. It is the floor of the relay: what uvloop,
  the sockets and a tunnel cost without any of the HTTP work;
* ``direct``: the backend itself, the floor.

The load is ``wrk`` (2 threads): for each target a 2 s warm-up (discarded), then ``DURATION_S``
(10) s at 64 connections; then ``ROUNDS`` (3) interleaved rounds of ``LATENCY_S`` (5) s at one
connection, whose p50s give each proxy's *added* latency (its p50 minus the direct p50, the
median over the rounds). The one-connection rounds run twice: with wrk, the proxies and the
backend all on one core (``one_core``: each hop is a context switch on that core, so the
figure is the proxy's own work), and where the scheduler puts them (``unpinned``: on this
virtual machine a wake-up on the other core costs tens of microseconds, which decides most of
that figure). Every request carries ``Host: bench.localhost``. The CPU each process used
during the timed runs is read from the kernel. Last, if py-spy is installed, a profile of the
one-process relay under the 64-connection load, summarised by where its samples fall.

``PROXY_DURATION_S``, ``PROXY_ROUNDS`` and ``PROXY_PROFILE=0`` change the run. Results go to
bench/results/proxy.json.

``python -m bench.proxy relay PORT BACKEND_PORT`` is one relay process (what ``souq`` runs).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.stats import machine_line
from souq.natsserver import free_port
from souq.procs import terminate

HOST = "bench.localhost"
THREADS = 2
CONNECTIONS = 64
DURATION_S = 10
WARMUP_S = 2
LATENCY_S = 5
ROUNDS = 3
PROFILE_S = 8
MARK = "PROXY_JSON "
ROOT = Path(__file__).resolve().parents[1]

LUA = r"""
wrk.headers["Host"] = "HOST"

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'MARK{"requests": %.0f, "duration_us": %.0f, "errors": {"connect": %.0f, "read": %.0f, ' ..
    '"write": %.0f, "timeout": %.0f, "status": %.0f}, "latency_us": {"p50": %.0f, ' ..
    '"p90": %.0f, "p99": %.0f, "mean": %.1f, "max": %.0f}}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.timeout, e.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean,
    latency.max))
end
"""

NGINX_COMMON = """
worker_rlimit_nofile 65536;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {root}/body;
  proxy_temp_path {root}/proxy;
  fastcgi_temp_path {root}/fastcgi;
  uwsgi_temp_path {root}/uwsgi;
  scgi_temp_path {root}/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 75s;
  {body}
}}
"""

BACKEND = """
  server {{
    listen 127.0.0.1:{port};
    location / {{ default_type text/plain; return 200 "hello from the backend\\n"; }}
  }}
"""

NGINX_PROXY = """
  upstream backend {{
    server 127.0.0.1:{backend};
    keepalive 128;
    keepalive_requests 1000000;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Forwarded-Host $host;
    }}
  }}
"""


@dataclass
class Target:
    name: str
    port: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def pids(self) -> list[int]:
        """The target's processes, an nginx master's workers included."""
        out = []
        for proc in self.procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p = psutil.Process(proc.pid)
                out += [p.pid, *(c.pid for c in p.children(recursive=True))]
        return out


def _nginx(root: Path, workers: str, body: str) -> subprocess.Popen[bytes]:
    root.mkdir(parents=True)
    conf = root / "nginx.conf"
    text = f"worker_processes {workers};\n" + NGINX_COMMON.format(root=root, body=body)
    conf.write_text(text)
    cmd = ["nginx", "-p", str(root), "-e", str(root / "error.log"), "-c", str(conf)]
    return subprocess.Popen([*cmd, "-g", "daemon off;"], stdout=subprocess.DEVNULL)


def _relay(port: int, backend_port: int, log: Path, mode: str = "http") -> subprocess.Popen[bytes]:
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "bench.proxy", "relay", str(port), str(backend_port), mode],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _ready(target: Target, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for proc in target.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{target.name} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(target.url, headers={"Host": HOST}, timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{target.name} did not answer on port {target.port}")
        time.sleep(0.05)


@contextlib.contextmanager
def _targets(root: Path) -> Iterator[list[Target]]:
    backend_port, nginx_port, one_port, two_port, tcp_port = (free_port() for _ in range(5))
    direct = Target("direct", backend_port)
    nginx = Target("nginx", nginx_port)
    one = Target("souq", one_port)
    two = Target("souq x2", two_port)
    tcp = Target("souq tcp", tcp_port)
    targets = [direct, nginx, one, two, tcp]
    try:
        direct.procs.append(_nginx(root / "backend", "1", BACKEND.format(port=backend_port)))
        _ready(direct)
        body = NGINX_PROXY.format(port=nginx_port, backend=backend_port)
        nginx.procs.append(_nginx(root / "nginx", "auto", body))
        one.procs.append(_relay(one_port, backend_port, root / "souq.log"))
        two.procs += [_relay(two_port, backend_port, root / "souq2.log") for _ in range(2)]
        tcp.procs.append(_relay(tcp_port, backend_port, root / "souq-tcp.log", "tcp"))
        for target in targets:
            _ready(target)
        yield targets
    finally:
        terminate(*(p for t in targets for p in t.procs), timeout=10)


def _wrk(
    url: str, script: Path, connections: int, duration_s: int, cpu: int | None = None
) -> dict[str, Any]:
    threads = min(THREADS, connections)
    cmd = [] if cpu is None else ["taskset", "-c", str(cpu)]
    cmd += ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{duration_s}s"]
    cmd += ["--timeout", "10s", "-s", str(script), url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 60, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr}")
    out: dict[str, Any] = json.loads(lines[-1][len(MARK) :])
    return out


def _cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


def throughput(target: Target, backend: Target, script: Path, duration_s: int) -> dict[str, Any]:
    _wrk(target.url, script, CONNECTIONS, WARMUP_S)
    pids = {"proxy": target.pids(), "backend": backend.pids()} if target is not backend else {}
    pids.setdefault("backend", backend.pids())
    before = {name: _cpu_s(p) for name, p in pids.items()}
    t0 = time.perf_counter()
    out = _wrk(target.url, script, CONNECTIONS, duration_s)
    wall = time.perf_counter() - t0
    cpu = {name: round(100 * (_cpu_s(p) - before[name]) / wall, 1) for name, p in pids.items()}
    seconds = out["duration_us"] / 1e6
    errors = sum(out["errors"].values())
    return {
        "connections": CONNECTIONS,
        "threads": THREADS,
        "duration_s": round(seconds, 2),
        "requests": out["requests"],
        "requests_per_s": round(out["requests"] / seconds, 1),
        "errors": errors,
        "errors_by_kind": out["errors"],
        "latency_ms": {k: round(v / 1000, 3) for k, v in out["latency_us"].items()},
        "cpu_pct_of_one_core": cpu,
        "processes": len(target.procs) if target.name.startswith("souq") else None,
    }


def _cpu_split(pids: list[int]) -> tuple[float, float]:
    user = system = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = psutil.Process(pid).cpu_times()
            user, system = user + t.user, system + t.system
    return user, system


@contextlib.contextmanager
def _on_one_core(targets: list[Target], cpu: int | None) -> Iterator[None]:
    """Every target's processes on ``cpu`` (None: wherever the scheduler puts them)."""
    if cpu is None:
        yield
        return
    pids = [pid for t in targets for pid in t.pids()]
    before = {pid: psutil.Process(pid).cpu_affinity() for pid in pids}
    try:
        for pid in pids:
            psutil.Process(pid).cpu_affinity([cpu])
        yield
    finally:
        for pid, cpus in before.items():
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).cpu_affinity(cpus)


def latency(targets: list[Target], script: Path, rounds: int, cpu: int | None) -> dict[str, Any]:
    """``rounds`` interleaved rounds at one connection; with ``cpu``, wrk, the proxies and the
    backend all run on that core."""
    samples: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
    cpu_used: dict[str, list[float]] = {t.name: [0.0, 0.0, 0.0] for t in targets}
    with _on_one_core(targets, cpu):
        for _ in range(rounds):
            for target in targets:
                _wrk(target.url, script, 1, 1, cpu=cpu)
                pids = target.pids()
                user0, sys0 = _cpu_split(pids)
                run = _wrk(target.url, script, 1, LATENCY_S, cpu=cpu)
                user1, sys1 = _cpu_split(pids)
                samples[target.name].append(run)
                used = cpu_used[target.name]
                used[0] += user1 - user0
                used[1] += sys1 - sys0
                used[2] += run["requests"]
    out: dict[str, Any] = {}
    for name, runs in samples.items():
        p50 = [r["latency_us"]["p50"] for r in runs]
        p99 = [r["latency_us"]["p99"] for r in runs]
        user, system, requests = cpu_used[name]
        out[name] = {
            "p50_us_by_round": p50,
            "p50_us": statistics.median(p50),
            "p99_us": statistics.median(p99),
            "requests_per_s": round(
                statistics.median(r["requests"] / r["duration_us"] * 1e6 for r in runs), 1
            ),
            "errors": sum(sum(r["errors"].values()) for r in runs),
            "cpu_us_per_request": {
                "user": round(1e6 * user / max(requests, 1), 2),
                "system": round(1e6 * system / max(requests, 1), 2),
            },
        }
    direct = out["direct"]["p50_us"]
    for name, row in out.items():
        row["added_p50_us"] = None if name == "direct" else row["p50_us"] - direct
    return out


def profile(target: Target, script: Path, root: Path) -> dict[str, Any] | None:
    """py-spy's samples of the relay under load, by where they fall."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return None
    raw = root / "profile.txt"
    wrk = ["wrk", "-t", str(THREADS), "-c", str(CONNECTIONS), "-d", f"{PROFILE_S + 2}s"]
    load = subprocess.Popen([*wrk, "-s", str(script), target.url], stdout=subprocess.DEVNULL)
    try:
        time.sleep(1)
        cmd = [spy, "record", "-p", str(target.procs[0].pid), "-d", str(PROFILE_S), "-r", "250"]
        cmd += ["-f", "raw", "-o", str(raw), "--native"]  # native: the compiled frames
        subprocess.run(cmd, capture_output=True, timeout=PROFILE_S + 30, check=False)
    finally:
        load.wait(PROFILE_S + 30)
    if not raw.exists():
        return None
    return summarise_profile(raw.read_text())


def summarise_profile(text: str) -> dict[str, Any]:
    """Where the relay's samples fall, by the innermost frame that says: a socket write, the
    httptools parse (llhttp, and its calls into the callbacks, whose own frames count apart),
    or the relay's own code (its modules, compiled with mypyc or as Python); samples with none
    of them are uvloop's event loop (epoll, socket reads, calling the protocols)."""
    kinds: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        kind, function = _sample_kind(stack.split(";"))
        kinds[kind] += n
        if function:
            functions[function] += n
    return {
        "samples": total,
        "share_pct": {k: round(100 * v / total, 1) for k, v in kinds.most_common()},
        "relay_by_function_pct": {
            k: round(100 * v / total, 1) for k, v in functions.most_common(12)
        },
    }


_COMPILED = re.compile(r"CPy(?:Def|Py)_(\w+?)___(\w+)")


def _sample_kind(frames: list[str]) -> tuple[str, str]:
    for frame in reversed(frames):
        name, _, where = frame.partition(" (")
        if "write" in name.lower() and not name.startswith("CPy"):
            return "socket writes (transport.write)", ""
        if name.startswith(("llhttp", "parser_cb", "HttpParser")) or name == "feed_data":
            return "httptools parsing (llhttp, and calling the callbacks)", ""
        compiled = _COMPILED.match(name)
        if compiled:
            module, function = compiled.groups()
            return "the relay's own code", f"{module}.py {function.replace('___', '.')}"
        if "souq/proxy/" in where:
            return "the relay's own code", f"{where.rsplit('/', 1)[-1].split(':')[0]} {name}"
    return "event loop (uvloop: epoll, socket reads, dispatch)", ""


class _FakeTransport:
    """A socket that takes every write and does nothing: the in-process measure."""

    def write(self, data: bytes) -> None:
        return None

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def close(self) -> None:
        return None

    def is_closing(self) -> bool:
        return False


IN_PROCESS_REQUEST = b"GET / HTTP/1.1\r\nHost: bench.localhost\r\n\r\n"
IN_PROCESS_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Wed, 25 Nov 2026 04:25:00 GMT\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 23\r\nConnection: keep-alive\r\n\r\n"
    b"hello from the backend\n"
)


def in_process(requests: int = 200_000, rounds: int = 5) -> dict[str, Any]:
    """The relay's own Python per request, with no socket: a client connection and a machine
    connection of the relay fed the bytes the benchmark exchanges, the best of ``rounds``."""
    from souq import daemon
    from souq.proxy import Backend, Relay, RelayConfig, RoutingTable
    from souq.proxy.downstream import ClientConnection
    from souq.proxy.upstream import UpstreamConnection

    async def measure() -> float:
        table = RoutingTable()
        table.upsert(Backend(machine_id="m", app="bench", region="local", host="127.0.0.1", port=1))
        relay = Relay(table, config=RelayConfig(region="local"))
        machine = UpstreamConnection(relay.pool, ("127.0.0.1", 1))
        machine.connection_made(_FakeTransport())  # type: ignore[arg-type]
        relay.pool.checkin(machine)
        client = ClientConnection(relay, relay.clients)
        client.connection_made(_FakeTransport())  # type: ignore[arg-type]
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(requests // rounds):
                client.data_received(IN_PROCESS_REQUEST)
                machine.data_received(IN_PROCESS_RESPONSE)
            best = min(best, time.perf_counter() - t0)
        return 1e6 * best / (requests // rounds)

    result: dict[str, float] = {}

    async def run() -> None:
        result["us"] = await measure()

    daemon.run(run())
    return {"python_us_per_request": round(result["us"], 2), "requests": requests}


def proxy() -> None:
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed: `make bench` installs it (apt-get)")
    duration_s = int(os.environ.get("PROXY_DURATION_S", DURATION_S))
    rounds = int(os.environ.get("PROXY_ROUNDS", ROUNDS))
    print(f"# proxy benchmark — nginx and the Souq relay — {machine_line()}", flush=True)
    results: dict[str, Any] = {
        "command": "python -m bench proxy",
        "machine": machine_line(),
        "backend": "nginx 1 worker, return 200 (23-byte body)",
        "nginx": subprocess.run(
            ["nginx", "-v"], capture_output=True, text=True, check=False
        ).stderr.strip(),
    }
    with (
        tempfile.TemporaryDirectory(prefix="souq-bench-proxy-") as tmp,
        _targets(Path(tmp)) as targets,
    ):
        script = Path(tmp) / "host.lua"
        script.write_text(LUA.replace("HOST", HOST).replace("MARK", MARK))
        direct = targets[0]
        results["throughput"] = {}
        for target in targets:
            row = throughput(target, direct, script, duration_s)
            results["throughput"][target.name] = row
            print("throughput", target.name, json.dumps(row), flush=True)
        results["latency_1_connection"] = {}
        for layout, cpu in (("one_core", 0), ("unpinned", None)):
            row = latency(targets, script, rounds, cpu)
            results["latency_1_connection"][layout] = row
            print("latency", layout, json.dumps(row), flush=True)
        results["in_process"] = in_process()
        print("in process", json.dumps(results["in_process"]), flush=True)
        if os.environ.get("PROXY_PROFILE", "1") != "0":
            results["profile_souq_64_connections"] = profile(targets[2], script, Path(tmp))
    tp, lat = results["throughput"], results["latency_1_connection"]
    nginx_rps = tp["nginx"]["requests_per_s"]
    results["ratios"] = {
        "souq_vs_nginx_throughput": round(tp["souq"]["requests_per_s"] / nginx_rps, 3),
        "souq_x2_vs_nginx_throughput": round(tp["souq x2"]["requests_per_s"] / nginx_rps, 3),
        "souq_tcp_vs_nginx_throughput": round(tp["souq tcp"]["requests_per_s"] / nginx_rps, 3),
        **{
            f"souq_vs_nginx_added_p50_{layout}": round(
                rows["souq"]["added_p50_us"] / max(rows["nginx"]["added_p50_us"], 1), 3
            )
            for layout, rows in lat.items()
        },
        "errors": {name: row["errors"] for name, row in tp.items()},
    }
    print(json.dumps(results["ratios"], indent=2))
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "proxy.json").write_text(json.dumps(results, indent=2) + "\n")


def relay_main(port: int, backend_port: int, mode: str) -> None:
    """One relay process: app ``bench`` is the backend, on ``127.0.0.1:port``, as HTTP (Host
    ``bench.localhost``) or (``mode`` ``tcp``) as a raw TCP service."""
    from souq import daemon
    from souq.proxy import Backend, Relay, RelayConfig, RoutingTable

    async def serve() -> None:
        table = RoutingTable()
        table.upsert(
            Backend(
                machine_id="backend",
                app="bench",
                region="local",
                host="127.0.0.1",
                port=backend_port,
                soft_limit=10_000,
                hard_limit=10_000,
            )
        )
        async with Relay(table, config=RelayConfig(region="local")) as relay:
            if mode == "tcp":
                await relay.listen_tcp("127.0.0.1", port, app="bench")
            else:
                await relay.listen_http("127.0.0.1", port)
            await asyncio.Event().wait()

    daemon.run(serve())


def main() -> None:
    proxy()


if __name__ == "__main__":
    if sys.argv[1:2] == ["relay"]:
        relay_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] if sys.argv[4:] else "http")
    else:
        main()
