"""Scale from zero, resume from suspend and standby failover, through ``souq proxy``.

Suite ``wake`` (``python -m bench wake``), on a real cluster (nats-server, two ``souq agent``
processes, a broker) and a ``souq proxy`` process, all on this machine:

* **scale from zero**: the app's only machine is stopped; one ``GET`` through the proxy, timed
  to its first byte (the proxy starts the machine through its worker, waits for its port, then
  forwards). Beside it, in the same run, the floor: the same app started directly (``Popen``
  with a ``PORT``), its port polled the same way, then the same ``GET``, to the first byte.
  Target: Souq ≤ the floor + 25 ms.
* **resume**: the machine is suspended (frozen, its port kept); one ``GET`` through the proxy,
  to the first byte. Target: ≤ 15 ms.
* **standby failover**: a primary and its standby (on the other worker, stopped); the primary's
  agent is killed (``kill -9``, with its machine: the host is gone), then requests go through
  the proxy until one is answered by the standby. Timed from the kill. Target: ≤ 10 s. The
  agents beat every second and count as down after three missed beats (the defaults).

The app is a small Python HTTP server (``bench/wake_app.py``: the standard library, no
framework), the kind of app a user brings.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.stats import machine_line
from souq.model import MachineState
from souq.natsserver import free_port
from souq.testing import Cluster, ProxyProcess, wait_until

APP_SCRIPT = str(Path(__file__).with_name("wake_app.py"))
REGION = "mad"
ROUNDS = int(os.environ.get("WAKE_ROUNDS", "15"))
CONFIG = {
    "cmd": [sys.executable, APP_SCRIPT],
    "guest": {"cpus": 0.5, "memory_mb": 128},
    "services": [{"internal_port": 8080, "autostop": "stop"}],
}


def first_byte(url: str, host: str | None = None, timeout: float = 30.0) -> float:
    """Seconds from sending a GET to reading the first byte of the answer (a fresh
    connection, as a new visitor's)."""
    host_header = host or "x"
    addr = url.removeprefix("http://")
    name, _, port = addr.partition(":")
    t0 = time.perf_counter()
    with socket.create_connection((name, int(port)), timeout=timeout) as sock:
        sock.sendall(f"GET / HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n".encode())
        data = sock.recv(1)
    elapsed = time.perf_counter() - t0
    if not data:
        raise RuntimeError(f"no answer from {url} (Host: {host_header})")
    return elapsed


def direct_start() -> float:
    """The floor: start the app directly, poll its port, then GET it (to the first byte)."""
    port = free_port()
    env = {**os.environ, "PORT": str(port)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, APP_SCRIPT],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        pause = 0.0005
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(pause)
                pause = min(0.02, pause * 2)
        first_byte(f"http://127.0.0.1:{port}")
        return time.perf_counter() - t0
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def summary(xs: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in xs)
    return {
        "p50": round(statistics.median(ms), 2),
        "p90": round(ms[int(0.9 * (len(ms) - 1))], 2),
        "min": round(ms[0], 2),
        "max": round(ms[-1], 2),
        "n": len(ms),
    }


def scale_from_zero(cluster: Cluster, proxy: ProxyProcess) -> dict[str, object]:
    client = cluster.client()
    app = "wakebench"
    m = client.create_machine(app, REGION, CONFIG)
    host = f"{app}.localhost"
    wait_until(lambda: _ok(proxy.url, host), message="the app through the proxy")
    souq: list[float] = []
    floor: list[float] = []
    for _ in range(ROUNDS):
        client.stop(app, m.id)
        client.wait(app, m.id, MachineState.STOPPED)
        wait_until(lambda: _state_seen(proxy, app, "stopped"), message="the proxy to see it")
        floor.append(direct_start())
        souq.append(first_byte(proxy.url, host))
    client.destroy(app, m.id, force=True)
    s, f = summary(souq), summary(floor)
    return {
        "souq_ms": s,
        "direct_ms": f,
        "added_p50_ms": round(s["p50"] - f["p50"], 2),
        "target": "souq p50 <= direct p50 + 25 ms",
        "met": s["p50"] <= f["p50"] + 25,
    }


def resume(cluster: Cluster, proxy: ProxyProcess) -> dict[str, object]:
    client = cluster.client()
    app = "resumebench"
    m = client.create_machine(
        app, REGION, {**CONFIG, "services": [{"internal_port": 8080, "autostop": "suspend"}]}
    )
    host = f"{app}.localhost"
    wait_until(lambda: _ok(proxy.url, host), message="the app through the proxy")
    souq: list[float] = []
    for _ in range(ROUNDS):
        client.suspend(app, m.id)
        wait_until(lambda: _state_seen(proxy, app, "suspended"), message="the proxy to see it")
        souq.append(first_byte(proxy.url, host))
    client.destroy(app, m.id, force=True)
    s = summary(souq)
    return {"souq_ms": s, "target": "p50 <= 15 ms", "met": s["p50"] <= 15}


def failover(root: Path) -> dict[str, object]:
    """In a cluster of its own (its primary's agent is killed)."""
    with (
        Cluster(root, regions={REGION: 2}) as cluster,
        ProxyProcess(
            nats_url=cluster.nats.url,
            log_path=root / "proxy.log",
            extra_args=["--autostop-interval", "3600"],
        ) as proxy,
    ):
        client = cluster.client()
        app = "failbench"
        primary = client.create_machine(app, REGION, CONFIG)
        standby = client.create_machine(app, REGION, {**CONFIG, "standbys": [primary.id]})
        host = f"{app}.localhost"
        wait_until(lambda: _ok(proxy.url, host), message="the app through the proxy")
        wait_until(lambda: _state_seen(proxy, app, "stopped"), message="the standby known")
        [agent] = [a for a in cluster.agents if a.worker_id == primary.worker_id]
        t0 = time.perf_counter()
        os.kill(agent.pid, signal.SIGKILL)
        assert primary.pid is not None
        os.killpg(primary.pid, signal.SIGKILL)  # the host is gone with its machines
        served = wait_until(
            lambda: _answered_by(proxy.url, host, standby.id),
            timeout=60,
            interval=0.05,
            message="the standby to answer",
        )
        took = time.perf_counter() - t0
        assert served
    return {"seconds": round(took, 2), "target": "<= 10 s", "met": took <= 10}


def _ok(url: str, host: str) -> bool:
    try:
        return httpx.get(url, headers={"Host": host}, timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def _answered_by(url: str, host: str, machine_id: str) -> bool:
    try:
        r = httpx.get(url, headers={"Host": host}, timeout=2)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and r.json().get("machine_id") == machine_id


def _state_seen(proxy: ProxyProcess, app: str, state: str) -> bool:
    """Whether the proxy sees a machine of ``app`` in ``state`` (its admin port's table)."""
    r = httpx.get(proxy.admin_url + "/backends", params={"app": app}, timeout=5)
    return any(b["state"] == state for b in r.json())


def main() -> None:
    print(f"# wake benchmark — {machine_line()}")
    with tempfile.TemporaryDirectory(prefix="souq-bench-") as tmp:
        root = Path(tmp)
        with (
            Cluster(root / "c", regions={REGION: 2}) as cluster,
            ProxyProcess(
                nats_url=cluster.nats.url,
                log_path=root / "proxy.log",
                extra_args=["--autostop-interval", "3600"],
            ) as proxy,
        ):
            results: dict[str, object] = {
                "scale_from_zero": scale_from_zero(cluster, proxy),
                "resume": resume(cluster, proxy),
            }
        results["standby_failover"] = failover(root / "f")
    print(json.dumps(results, indent=2))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "wake.json").write_text(json.dumps({"machine": machine_line(), **results}, indent=2))


if __name__ == "__main__":
    main()
