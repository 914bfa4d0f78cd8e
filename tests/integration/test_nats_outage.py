"""NATS outages, for real: a running cluster loses its nats-server under load, then gets it back.

Meanwhile machines keep running and their restart policies keep working (seen in the agents'
own SQLite files, which need no bus), the broker answers 503 ``unavailable`` at once, and after
the server is back on the same port the broker recovers by itself and its view converges on
what the agents know, events of the outage included.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from souq.testing import AgentProcess, Cluster, auth_headers, wait_until
from tests.clusters import ClusterSpec, cluster_fixture

APP = "outage"
LOAD_APP = "load"
SMALL = {"cpus": 0.05, "memory_mb": 16}
BUS_DOWN_S = 3.5  # longer than a worker's down window (3 missed 1 s heartbeats)


@dataclass(frozen=True)
class Row:
    state: str
    pid: int | None
    restarts: int


def agent_rows(agent: AgentProcess) -> dict[str, Row]:
    """The agent's own record of its machines, read-only from its state file."""
    db = sqlite3.connect(f"file:{agent.data_dir / 'state.db'}?mode=ro", uri=True, timeout=5)
    try:
        rows = db.execute("SELECT id, state, pid, restarts FROM machines").fetchall()
    finally:
        db.close()
    return {mid: Row(state, pid, restarts) for mid, state, pid, restarts in rows}


def agent_events(agent: AgentProcess, since_ms: int, until_ms: int) -> set[tuple[Any, ...]]:
    db = sqlite3.connect(f"file:{agent.data_dir / 'state.db'}?mode=ro", uri=True, timeout=5)
    try:
        rows = db.execute(
            "SELECT machine_id, ts, type, status FROM events WHERE ts >= ? AND ts <= ?",
            (since_ms, until_ms),
        ).fetchall()
    finally:
        db.close()
    return {tuple(r) for r in rows}


def feed_events(http: httpx.Client, app: str) -> set[tuple[Any, ...]]:
    """The machine events the broker's stream holds for ``app`` (``GET /v1/events``)."""
    r = http.get("/v1/events", params={"app": app})
    assert r.status_code == 200, r.text
    out = set()
    for line in r.text.splitlines():
        if line.startswith("data: "):
            item = json.loads(line[len("data: ") :])
            if item.get("kind") == "machine":
                e = item["event"]
                out.add((item["machine_id"], e["timestamp"], e["type"], e["status"]))
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def create(http: httpx.Client, app: str, cmd: list[str], **config: Any) -> dict[str, Any]:
    body = {"region": "mad", "config": {"cmd": cmd, "guest": SMALL, **config}}
    r = http.post(f"/v1/apps/{app}/machines", json=body)
    assert r.status_code == 201, r.text
    machine: dict[str, Any] = r.json()
    return machine


@dataclass
class Load:
    """Creates and lists in a loop from a thread, recording every answer."""

    url: str
    answers: list[tuple[float, str, int, str]] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body = {"region": "mad", "skip_launch": True, "config": {"cmd": ["true"], "guest": SMALL}}
        with httpx.Client(base_url=self.url, headers=auth_headers(), timeout=30) as http:
            while not self.stop.is_set():
                for what in ("create", "list"):
                    started = time.monotonic()
                    try:
                        if what == "create":
                            r = http.post(f"/v1/apps/{LOAD_APP}/machines", json=body)
                        else:
                            r = http.get(f"/v1/apps/{LOAD_APP}/machines")
                        status = r.json().get("status", "") if r.status_code >= 400 else ""
                    except (httpx.HTTPError, ValueError) as exc:  # recorded: the test fails
                        self.answers.append((time.monotonic() - started, what, -1, repr(exc)))
                        continue
                    self.answers.append((time.monotonic() - started, what, r.status_code, status))
                    if what == "create" and r.status_code == 201:
                        self.created.append(r.json()["id"])
                self.stop.wait(0.02)  # pacing: a steady load, not a flood on a small box

    def unavailable(self) -> int:
        return sum(
            1 for _, _, code, status in self.answers if (code, status) == (503, "unavailable")
        )

    def created_after(self, mark: int) -> bool:
        return any(code == 201 for _, what, code, _ in self.answers[mark:] if what == "create")


# A cluster of its own: the module-wide one must not lose its NATS server.
own_cluster = cluster_fixture(ClusterSpec("outage", regions={"mad": 2}), scope="function")


def test_a_nats_outage_under_load_loses_nothing(own_cluster: Cluster) -> None:
    cluster = own_cluster
    http = httpx.Client(base_url=cluster.api_url, headers=auth_headers(), timeout=30)
    owners = {a.worker_id: a for a in cluster.agents}

    def truth(machine_id: str, worker_id: str) -> Row:
        return agent_rows(owners[worker_id])[machine_id]

    steady = [create(http, APP, ["sleep", "600"]) for _ in range(3)]
    victim = create(http, APP, ["sleep", "600"], restart={"policy": "always"})
    looping = create(http, APP, ["sh", "-c", "sleep 0.2; exit 1"], restart={"policy": "always"})
    machines = [*steady, victim, looping]
    before = {m["id"]: truth(m["id"], m["worker_id"]) for m in machines}
    for m in steady:
        pid = before[m["id"]].pid
        assert pid is not None and alive(pid)

    load = Load(cluster.api_url)
    loader = threading.Thread(target=load.run, name="load")
    loader.start()
    try:
        wait_until(lambda: len(load.created) >= 3, timeout=20, message="the load to create")

        # -- the outage --------------------------------------------------------------------
        down_ms = int(time.time() * 1000)
        down_at = time.monotonic()
        cluster.nats.stop(keep_store=True)
        wait_until(lambda: load.unavailable() >= 3, timeout=10, message="503s under load")

        # Every call that needs the bus is refused at once, saying why.
        mid = steady[0]["id"]
        probes = [
            ("GET", "/healthz"),
            ("GET", "/v1/workers"),
            ("GET", "/v1/regions"),
            ("GET", f"/v1/apps/{APP}/machines"),
            ("GET", f"/v1/apps/{APP}/machines/{mid}"),
            ("POST", f"/v1/apps/{APP}/machines/{mid}/stop"),
        ]
        for method, path in probes:
            started = time.monotonic()
            r = http.request(method, path)
            assert time.monotonic() - started < 3, f"{method} {path} was slow to refuse"
            assert r.status_code == 503, (path, r.text)
            assert r.json()["status"] == "unavailable"
            assert "NATS" in r.json()["error"]

        # Machines run on, and restart, without the bus.
        victim_pid = before[victim["id"]].pid
        assert victim_pid is not None
        os.kill(victim_pid, signal.SIGKILL)

        def restarted() -> Row | None:
            row = truth(victim["id"], victim["worker_id"])
            return row if row.state == "started" and row.pid not in (None, victim_pid) else None

        victim_now = wait_until(restarted, timeout=15, message="the victim restarted offline")
        assert victim_now is not None
        assert victim_now.restarts == before[victim["id"]].restarts + 1
        loops_at_start = truth(looping["id"], looping["worker_id"]).restarts
        wait_until(
            lambda: truth(looping["id"], looping["worker_id"]).restarts >= loops_at_start + 2,
            timeout=20,
            message="the crash loop to go on restarting offline",
        )
        wait_until(lambda: time.monotonic() - down_at > BUS_DOWN_S, timeout=BUS_DOWN_S + 1)
        for m in steady:
            row = truth(m["id"], m["worker_id"])
            assert (row.state, row.pid) == ("started", before[m["id"]].pid)
            assert row.pid is not None and alive(row.pid)
        loops_offline = truth(looping["id"], looping["worker_id"]).restarts
        refused = load.unavailable()

        # -- the server is back, on the same port -----------------------------------------
        cluster.nats.start()
        up_ms = int(time.time() * 1000)
        mark = len(load.answers)
        wait_until(lambda: http.get("/healthz").status_code == 200, timeout=15, message="recovery")
        wait_until(lambda: load.created_after(mark), timeout=15, message="creates again")
        assert load.unavailable() >= refused  # (the load saw the outage)
    finally:
        load.stop.set()
        loader.join(timeout=60)

    # Under load, every answer was a success or a clear 503: nothing hung, nothing misleading.
    odd = [a for a in load.answers if a[2] not in (200, 201) and a[2:] != (503, "unavailable")]
    assert not odd, odd[:5]
    assert max(took for took, _, code, _ in load.answers if code == 503) < 3

    # The view converges on the agents' truth, what changed offline included.
    def listed(app: str) -> dict[str, dict[str, Any]]:
        r = http.get(f"/v1/apps/{app}/machines")
        assert r.status_code == 200, r.text
        return {m["id"]: m for m in r.json()}

    def converged() -> bool:
        view = listed(APP)
        for m in [*steady, victim]:
            row = truth(m["id"], m["worker_id"])
            seen = view.get(m["id"])
            if seen is None or (seen["state"], seen["pid"], seen["restarts"]) != (
                row.state,
                row.pid,
                row.restarts,
            ):
                return False
        loop_row = truth(looping["id"], looping["worker_id"])
        seen = view.get(looping["id"])
        return seen is not None and seen["state"] == loop_row.state

    wait_until(converged, timeout=20, message="the view to converge")
    assert listed(APP)[victim["id"]]["pid"] == victim_now.pid
    assert listed(APP)[looping["id"]]["restarts"] >= loops_offline

    # Every event the agents recorded during the outage reached the broker's stream.
    offline = set()
    for agent in cluster.agents:
        offline |= agent_events(agent, down_ms, up_ms)
    ours = {e for e in offline if e[0] in {m["id"] for m in machines}}
    assert {e[2] for e in ours} >= {"exit", "restart"}  # the kill and the loop, offline
    wait_until(lambda: ours <= feed_events(http, APP), timeout=20, message="the outage's events")

    # No worker was taken for dead because the broker could not hear it.
    r = http.get("/v1/events")
    workers_down = [ln for ln in r.text.splitlines() if '"kind":"worker"' in ln and '"down"' in ln]
    assert not workers_down, workers_down

    # Nothing the load was told it created is missing.
    assert set(load.created) <= set(listed(LOAD_APP))
    http.close()
