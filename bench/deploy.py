"""A blue-green deploy against one machine becoming healthy, in the same cluster and run.

Suite ``deploy`` (``python -m bench deploy``): a broker and three agents (regions mad, syd, ams)
on loopback; the app is a small HTTP server (Python's ``http.server``) with an HTTP health check
every 0.2 s.

* **one machine healthy** — create one machine of the app and wait until it is started and its
  check passes (``wait?healthy=true``), then destroy it; the median of ``DEPLOY_ROUNDS``;
* **blue-green deploy** — ``souq.client.deploy`` of a new release over the live one, 3 machines
  in each region: a release made, 9 machines leased, 9 green machines created and healthy, the 9
  blue ones stopped (each out of the proxy's rotation for its drain, 0.5 s) and destroyed; the
  median of ``DEPLOY_ROUNDS`` deploys.

The ratio is the deploy's median over the single machine's.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import machine_line
from souq.apps import load_app_config
from souq.client.deploy import Deployer, DeployEvent
from souq.images import layout_tar, pack_directory
from souq.model.machine import MachineState
from souq.testing import Cluster

ROUNDS = 5
SERVER = """\
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


def _toml(image: str, greeting: str) -> str:
    return f"""\
app = "bench"
primary_region = "mad"
[build]
image = "{image}"
[env]
GREETING = "{greeting}"
[processes]
app = "{sys.executable} server.py"
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


def run(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="souq-bench-deploy-") as tmp:
        root = Path(tmp)
        src = root / "app"
        src.mkdir()
        (src / "server.py").write_text(SERVER)
        regions = {"mad": 1, "syd": 1, "ams": 1}
        with (
            Cluster(root / "cluster", regions=regions, cpus=16, memory_mb=8192) as cluster,
            cluster.client(timeout=120) as client,
        ):
            image = client.push_image(layout_tar(pack_directory(src))).reference
            first = load_app_config(_toml(image, "v0"))
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
                config = load_app_config(_toml(image, f"v{i + 1}"))
                t0 = time.perf_counter()
                seen: dict[str, float] = {}

                def mark(e: DeployEvent, t0: float = t0, seen: dict[str, float] = seen) -> None:
                    key = e.phase or e.kind
                    seen[key] = round((time.perf_counter() - t0) * 1000, 1)

                Deployer(client, config, image=image, on_event=mark).run()
                deploys.append(time.perf_counter() - t0)
                marks.append(seen)
    p50_one, p50_deploy = statistics.median(single), statistics.median(deploys)
    return {
        "rounds": rounds,
        "one_machine_healthy_p50_ms": round(p50_one * 1000, 1),
        "bluegreen_9_machines_3_regions_p50_ms": round(p50_deploy * 1000, 1),
        "ratio": round(p50_deploy / p50_one, 2),
        "one_machine_ms": [round(s * 1000, 1) for s in single],
        "deploys_ms": [round(s * 1000, 1) for s in deploys],
        "last_event_ms_by_phase": marks[len(marks) // 2],
    }


def main() -> None:
    rounds = int(os.environ.get("DEPLOY_ROUNDS", ROUNDS))
    print(f"# deploy benchmark — blue-green of 9 machines over 3 regions — {machine_line()}")
    results = {"command": "python -m bench deploy", "machine": machine_line(), **run(rounds)}
    print(json.dumps(results, indent=2))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "deploy.json").write_text(json.dumps(results, indent=2) + "\n")
