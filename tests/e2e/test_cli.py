"""The `souq` CLI end to end, as a user types it, against a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from souq.testing import Cluster
from tests.clusters import ClusterSpec

SOUQ = str(Path(sys.executable).with_name("souq"))


CLUSTER = ClusterSpec("cli", regions={"mad": 1, "syd": 1}, cpus=2)


def souq(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SOUQ_API": cluster.api_url}
    return subprocess.run(
        [SOUQ, *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_machine_commands_end_to_end(cluster: Cluster) -> None:
    app = "cli" + uuid.uuid4().hex[:8]
    run = souq(
        cluster,
        "machine",
        "run",
        "--app",
        app,
        "--region",
        "syd",
        "--env",
        "GREETING=hi",
        "--name",
        "greeter",
        "--",
        "sh",
        "-c",
        "echo $GREETING from $SOUQ_REGION; exec sleep 600",
    )
    assert run.returncode == 0, run.stderr
    mid = run.stdout.strip()
    assert len(mid) == 14

    listed = souq(cluster, "machine", "list", "--app", app, "--json")
    assert listed.returncode == 0, listed.stderr
    machines = json.loads(listed.stdout)
    assert [(m["id"], m["name"], m["region"], m["state"]) for m in machines] == [
        (mid, "greeter", "syd", "started")
    ]

    table = souq(cluster, "machine", "list", "--app", app)
    assert mid in table.stdout and "started" in table.stdout

    show = json.loads(souq(cluster, "machine", "show", mid, "--app", app, "--json").stdout)
    assert show["config"]["env"] == {"GREETING": "hi"}
    assert show["placement"]["winner"] == show["worker_id"]

    wait = souq(
        cluster, "machine", "wait", mid, "--app", app, "--state", "started", "--timeout", "10"
    )
    assert wait.returncode == 0, wait.stderr

    logs = souq(cluster, "machine", "logs", mid, "--app", app)
    assert "hi from syd" in logs.stdout

    stop = souq(
        cluster, "machine", "stop", mid, "--app", app, "--signal", "SIGTERM", "--timeout", "3"
    )
    assert stop.returncode == 0, stop.stderr
    state = json.loads(souq(cluster, "machine", "show", mid, "--app", app, "--json").stdout)
    assert state["state"] == "stopped"

    assert souq(cluster, "machine", "start", mid, "--app", app).returncode == 0
    assert souq(cluster, "machine", "restart", mid, "--app", app).returncode == 0

    refused = souq(cluster, "machine", "destroy", mid, "--app", app)
    assert refused.returncode not in (0, 3)
    assert "force" in refused.stderr

    destroyed = souq(cluster, "machine", "destroy", mid, "--app", app, "--force")
    assert destroyed.returncode == 0, destroyed.stderr
    assert json.loads(souq(cluster, "machine", "list", "--app", app, "--json").stdout) == []


def test_run_json_prints_the_machine(cluster: Cluster) -> None:
    app = "cli" + uuid.uuid4().hex[:8]
    run = souq(
        cluster,
        "machine",
        "run",
        "--app",
        app,
        "--region",
        "mad",
        "--cpus",
        "1",
        "--memory-mb",
        "128",
        "--restart",
        "no",
        "--skip-start",
        "--json",
        "--",
        "true",
    )
    assert run.returncode == 0, run.stderr
    machine = json.loads(run.stdout)
    assert machine["state"] == "created"
    assert machine["config"]["guest"] == {
        "cpu_kind": None,  # Fly's, kept as given
        "cpus": 1,
        "memory_mb": 128,
        "disk_mb": 0,
        "gpus": 0,
        "gpu_milli": 0,
        "gpu_model": None,
    }
    assert machine["config"]["restart"]["policy"] == "no"
    souq(cluster, "machine", "destroy", machine["id"], "--app", app)


def test_insufficient_capacity_exits_3(cluster: Cluster) -> None:
    app = "cli" + uuid.uuid4().hex[:8]
    r = souq(
        cluster,
        "machine",
        "run",
        "--app",
        app,
        "--region",
        "mad",
        "--cpus",
        "64",
        "--",
        "sleep",
        "1",
    )
    assert r.returncode == 3
    assert "insufficient" in r.stderr.lower()
    assert r.stdout == ""


def test_errors_go_to_stderr_with_non_zero_exit(cluster: Cluster) -> None:
    app = "cli" + uuid.uuid4().hex[:8]
    r = souq(cluster, "machine", "run", "--app", app, "--region", "atlantis", "--", "true")
    assert r.returncode not in (0, 3)
    assert "atlantis" in r.stderr
    missing = souq(cluster, "machine", "show", "0123456789abcd", "--app", app)
    assert missing.returncode not in (0, 3)
    assert "0123456789abcd" in missing.stderr


def test_workers_command(cluster: Cluster) -> None:
    r = souq(cluster, "workers", "--json")
    assert r.returncode == 0, r.stderr
    workers = json.loads(r.stdout)
    assert sorted(w["region"] for w in workers) == ["mad", "syd"]
    assert {"id", "region", "state", "capacity", "allocated", "labels"} <= set(workers[0])
    table = souq(cluster, "workers")
    assert "mad" in table.stdout and "syd" in table.stdout


def test_unreachable_api_is_a_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "SOUQ_API": "http://127.0.0.1:9"}
    r = subprocess.run(
        [SOUQ, "workers"], capture_output=True, text=True, env=env, timeout=30, check=False
    )
    assert r.returncode == 1
    assert "127.0.0.1:9" in r.stderr


def test_explain_dry_run_quote_and_cordon(cluster: Cluster) -> None:
    app = "cli" + uuid.uuid4().hex[:8]
    dry = souq(
        cluster,
        "machine",
        "run",
        "--app",
        app,
        "--region",
        "mad",
        "--dry-run",
        "--json",
        "--",
        "sleep",
        "600",
    )
    assert dry.returncode == 0, dry.stderr
    record = json.loads(dry.stdout)
    assert record["winner"] == cluster.agents[0].worker_id
    assert json.loads(souq(cluster, "machine", "list", "--app", app, "--json").stdout) == []

    created = souq(
        cluster,
        "quote",
        "create",
        "--app",
        app,
        "--region",
        "mad",
        "--cpus",
        "1",
        "--ttl",
        "60",
        "--json",
        "--",
        "sleep",
        "600",
    )
    assert created.returncode == 0, created.stderr
    quote = json.loads(created.stdout)
    assert quote["state"] == "held"
    shown = souq(cluster, "quote", "show", quote["id"], "--app", app)
    assert "held" in shown.stdout
    run = souq(
        cluster,
        "machine",
        "run",
        "--app",
        app,
        "--region",
        "mad",
        "--cpus",
        "1",
        "--quote",
        quote["id"],
        "--",
        "sleep",
        "600",
    )
    assert run.returncode == 0, run.stderr
    mid = run.stdout.strip()

    explain = souq(cluster, "machine", "explain", mid, "--app", app)
    assert explain.returncode == 0, explain.stderr
    assert f"winner {quote['worker_id']}" in explain.stdout
    assert "timings: gather" in explain.stdout

    again = souq(
        cluster,
        "machine",
        "run",
        "--app",
        app,
        "--region",
        "mad",
        "--cpus",
        "1",
        "--quote",
        quote["id"],
        "--",
        "sleep",
        "600",
    )
    assert again.returncode == 1
    assert "already used" in again.stderr

    worker = cluster.agents[0].worker_id
    assert worker is not None
    cordon = souq(cluster, "workers", "cordon", worker, "--json")
    assert cordon.returncode == 0, cordon.stderr
    assert json.loads(cordon.stdout)[0]["state"] == "cordoned"
    refused = souq(cluster, "machine", "run", "--app", app, "--region", "mad", "--", "true")
    assert refused.returncode == 3
    assert "cordoned" in refused.stderr
    assert souq(cluster, "workers", "uncordon", worker).returncode == 0
    souq(cluster, "machine", "destroy", mid, "--app", app, "--force")
