"""A blue-green deploy against one machine becoming healthy, in the same cluster and run.

Suite ``deploy`` (``python -m bench deploy``): a broker and three agents (regions mad, syd, ams)
on loopback, for two apps, each with an HTTP health check every 0.2 s:

* ``http.server`` — Python's ``http.server`` (about 80 to 100 ms of CPU to start);
* ``socket`` — a few lines of Python on a plain socket, started with ``-S`` (about 15 ms).

For each:

* **one machine healthy** — create one machine of the app and wait until it is started and its
  check passes (``wait?healthy=true``), then destroy it; the median of ``DEPLOY_ROUNDS``;
* **blue-green deploy** — ``souq.client.deploy`` of a new release over the live one, 3 machines
  in each region: a release made, 9 machines leased, the capacity of 9 green machines held, the
  9 made and healthy, the 9 blue ones destroyed gracefully (out of rotation at once); the median
  of ``DEPLOY_ROUNDS`` deploys.

The ratio is the deploy's median over the single machine's. The three regions' agents share
this machine's cores: nine apps booting at once compete for them, which hosts of their own
would not. How much, the same run measures without Souq: the app's process started directly,
once and nine at once, each polled every 5 ms until it answers (``direct_boot``).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import machine_line
from souq.apps import load_app_config
from souq.client.api import SouqClient
from souq.client.deploy import Deployer, DeployEvent
from souq.images import layout_tar, pack_directory
from souq.model.machine import MachineState
from souq.testing import Cluster

ROUNDS = 7
HTTP_SERVER = """\
import os
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""
SOCKET = """\
import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(os.environ["PORT"])))
s.listen(64)
while True:
    c, _ = s.accept()
    c.recv(65536)
    c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 0\\r\\nConnection: close\\r\\n\\r\\n")
    c.close()
"""
APPS = {"http.server": (HTTP_SERVER, ""), "socket": (SOCKET, "-S ")}


def _toml(app: str, image: str, greeting: str, flags: str) -> str:
    return f"""\
app = "{app}"
primary_region = "mad"
[build]
image = "{image}"
[env]
GREETING = "{greeting}"
[processes]
app = "{sys.executable} {flags}server.py"
[http_service]
internal_port = 8080
  [[http_service.checks]]
  path = "/"
  interval = "0.2s"
  timeout = "2s"
[[vm]]
cpus = 0.25
memory_mb = 64
[deploy]
strategy = "bluegreen"
wait_timeout = "60s"
[regions]
mad = 3
syd = 3
ams = 3
"""


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return conn.recv(12).startswith(b"HTTP/1.")
    except OSError:
        return False


def _direct_boot(server: Path, flags: str, count: int) -> float:
    """Seconds until ``count`` copies of the app, started at once without Souq, all answer."""
    ports = []
    for _ in range(count):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    argv = [sys.executable, *flags.split(), str(server)]
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(argv, env={**os.environ, "PORT": str(p)}, cwd=server.parent) for p in ports
    ]
    try:
        waiting, deadline = set(ports), t0 + 60
        while waiting and time.perf_counter() < deadline:
            waiting = {p for p in waiting if not _answers(p)}
            time.sleep(0.005)
        if waiting:
            raise RuntimeError(f"{len(waiting)} of {count} direct starts never answered")
        return time.perf_counter() - t0
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _measure(client: SouqClient, root: Path, name: str, rounds: int) -> dict[str, Any]:
    code, flags = APPS[name]
    app = "bench-" + name.replace(".", "")
    src = root / app
    src.mkdir()
    (src / "server.py").write_text(code)
    image = client.push_image(layout_tar(pack_directory(src))).reference
    first = load_app_config(_toml(app, image, "v0", flags))
    one_config = first.machine_config("app", image=image, release=0)
    single = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        m = client.create_machine("solo", "mad", one_config)
        client.wait("solo", m.id, MachineState.STARTED, timeout=60, healthy=True)
        single.append(time.perf_counter() - t0)
        client.destroy("solo", m.id, force=True)
    Deployer(client, first, image=image).run()  # the blue set
    deploys = []
    marks: list[dict[str, float]] = []
    for i in range(rounds):
        config = load_app_config(_toml(app, image, f"v{i + 1}", flags))
        t0 = time.perf_counter()
        seen: dict[str, float] = {}

        def mark(e: DeployEvent, t0: float = t0, seen: dict[str, float] = seen) -> None:
            seen[e.phase or e.kind] = round((time.perf_counter() - t0) * 1000, 1)

        Deployer(client, config, image=image, on_event=mark).run()
        deploys.append(time.perf_counter() - t0)
        marks.append(seen)
    p50_one, p50_deploy = statistics.median(single), statistics.median(deploys)
    one = statistics.median(_direct_boot(src / "server.py", flags, 1) for _ in range(rounds))
    nine = statistics.median(_direct_boot(src / "server.py", flags, 9) for _ in range(rounds))
    return {
        "one_machine_healthy_p50_ms": round(p50_one * 1000, 1),
        "bluegreen_9_machines_3_regions_p50_ms": round(p50_deploy * 1000, 1),
        "ratio": round(p50_deploy / p50_one, 2),
        "one_machine_ms": [round(s * 1000, 1) for s in single],
        "deploys_ms": [round(s * 1000, 1) for s in deploys],
        "last_event_ms_by_phase": marks[len(marks) // 2],
        "direct_boot": {
            "one_p50_ms": round(one * 1000, 1),
            "nine_at_once_p50_ms": round(nine * 1000, 1),
            "ratio": round(nine / one, 2),
        },
    }


def run(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="souq-bench-deploy-") as tmp:
        root = Path(tmp)
        regions = {"mad": 1, "syd": 1, "ams": 1}
        with (
            Cluster(root / "cluster", regions=regions, cpus=16, memory_mb=8192) as cluster,
            cluster.client(timeout=120) as client,
        ):
            return {"rounds": rounds, **{n: _measure(client, root, n, rounds) for n in APPS}}


def main() -> None:
    rounds = int(os.environ.get("DEPLOY_ROUNDS", ROUNDS))
    print(f"# deploy benchmark — blue-green of 9 machines over 3 regions — {machine_line()}")
    results = {"command": "python -m bench deploy", "machine": machine_line(), **run(rounds)}
    print(json.dumps(results, indent=2))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "deploy.json").write_text(json.dumps(results, indent=2) + "\n")
