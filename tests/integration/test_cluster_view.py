"""The cluster view on a real cluster: lists served from the view, workers that freeze or die
turn `down` (and their machines say so) and come back `up`, regions, and the event stream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import httpx
import pytest

from souq.testing import AgentProcess, Cluster, auth_headers, wait_until
from tests.clusters import ClusterSpec

BEAT_S = 0.2  # the short-lived agents beat fast, so that three missed beats take 0.6 s


CLUSTER = ClusterSpec("view", regions={"vw": 1}, cpus=2)


def machines(cluster: Cluster, app: str) -> httpx.Response:
    return httpx.get(
        f"{cluster.api_url}/v1/apps/{app}/machines", timeout=10, headers=auth_headers()
    )


def worker_state(cluster: Cluster, worker_id: str) -> str | None:
    for w in httpx.get(f"{cluster.api_url}/v1/workers", timeout=10, headers=auth_headers()).json():
        if w["id"] == worker_id:
            return str(w["state"])
    return None


def run_on(cluster: Cluster, agent: AgentProcess, app: str) -> dict[str, Any]:
    """A machine on ``agent``: the only worker of its own region."""
    body = {"region": agent.region, "config": {"cmd": ["sleep", "600"]}}
    r = httpx.post(
        f"{cluster.api_url}/v1/apps/{app}/machines", json=body, timeout=30, headers=auth_headers()
    )
    assert r.status_code == 201, r.text
    machine: dict[str, Any] = r.json()
    assert machine["worker_id"] == agent.worker_id
    return machine


def listed_worker_state(cluster: Cluster, app: str) -> str | None:
    found = machines(cluster, app).json()
    return str(found[0]["worker_state"]) if found else None


def test_lists_come_from_the_view_once_it_has_synced(cluster: Cluster) -> None:
    app = "v" + uuid.uuid4().hex[:8]
    r = httpx.post(
        f"{cluster.api_url}/v1/apps/{app}/machines",
        json={"region": "vw", "config": {"cmd": ["sleep", "600"]}},
        headers=auth_headers(),
        timeout=30,
    )
    assert r.status_code == 201, r.text
    mid = r.json()["id"]
    listed = machines(cluster, app)
    assert [m["id"] for m in listed.json()] == [mid]  # read-your-writes on this broker
    wait_until(
        lambda: machines(cluster, app).headers.get("X-Souq-View") == "view",
        timeout=15,
        message="the view to be complete",
    )
    fresh = machines(cluster, app)
    assert "X-Souq-View-As-Of" in fresh.headers and "X-Souq-View-Lag-Ms" in fresh.headers
    apps = {
        a["name"]: a
        for a in httpx.get(f"{cluster.api_url}/v1/apps", headers=auth_headers()).json()["apps"]
    }
    assert apps[app]["machines"] == 1
    regions = httpx.get(
        f"{cluster.api_url}/v1/regions?cpus=1&memory_mb=128", headers=auth_headers()
    ).json()
    (vw,) = [r for r in regions if r["name"] == "vw"]
    assert vw["workers_up"] == 1 and vw["fits"] == 1  # 2 cpus, one taken
    # a stop made through the worker shows in the view, and in the event stream
    httpx.post(
        f"{cluster.api_url}/v1/apps/{app}/machines/{mid}/stop",
        timeout=30,
        headers=auth_headers(),
    )

    def stopped() -> bool:
        return any(m["state"] == "stopped" for m in machines(cluster, app).json())

    wait_until(stopped, timeout=15, message="the stop to reach the view")
    text = httpx.get(
        f"{cluster.api_url}/v1/events?app={app}", timeout=10, headers=auth_headers()
    ).text
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert {e["machine_id"] for e in events} == {mid}
    assert "stopped" in {e["state"] for e in events}
    cli = subprocess.run(
        [sys.executable, "-m", "souq", "events", "--app", app, "--json"],
        env={**os.environ, "SOUQ_API": cluster.api_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert [json.loads(x)["seq"] for x in cli.stdout.splitlines()] == [e["seq"] for e in events]
    httpx.delete(
        f"{cluster.api_url}/v1/apps/{app}/machines/{mid}?force=true",
        timeout=30,
        headers=auth_headers(),
    )
    assert machines(cluster, app).json() == []


@pytest.mark.parametrize("how", ["freeze", "kill"])
def test_a_silent_worker_turns_down_and_its_machines_say_so(cluster: Cluster, how: str) -> None:
    region = "vz" + how
    agent = cluster.add_agent(region, heartbeat_interval_s=BEAT_S, cpus=1)
    assert agent.worker_id is not None
    wid = agent.worker_id
    wait_until(lambda: worker_state(cluster, wid) == "up", message="the worker to be up")
    app = "v" + uuid.uuid4().hex[:8]
    run_on(cluster, agent, app)
    assert listed_worker_state(cluster, app) == "up"
    follow = httpx.stream(
        "GET",
        f"{cluster.api_url}/v1/events?follow=true&worker={wid}",
        headers=auth_headers(),
        timeout=30,
    )
    with follow as stream:
        if how == "freeze":
            os.kill(agent.pid, signal.SIGSTOP)
        else:
            agent.kill()
        try:
            wait_until(
                lambda: worker_state(cluster, wid) == "down",
                timeout=10,
                message="the worker to be down",
            )
            assert listed_worker_state(cluster, app) == "down"
            seen = []
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))
                    if seen[-1]["kind"] == "worker" and seen[-1]["state"] == "down":
                        break
            assert seen[-1]["worker_id"] == wid
        finally:
            if how == "freeze":
                os.kill(agent.pid, signal.SIGCONT)
            else:
                agent.start()
    wait_until(lambda: worker_state(cluster, wid) == "up", message="the worker back up")
    wait_until(
        lambda: listed_worker_state(cluster, app) == "up",
        timeout=10,
        message="its machines to say so",
    )
    for m in machines(cluster, app).json():
        httpx.delete(
            f"{cluster.api_url}/v1/apps/{app}/machines/{m['id']}?force=true",
            headers=auth_headers(),
            timeout=30,
        )
