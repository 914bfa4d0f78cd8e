"""``souq simulate --from-cluster`` and ``--tasks``: options, output, exit codes (the client
stubbed; tests/integration/test_simulate_whatif.py runs them on a real cluster)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from souq.client import cli
from souq.model import Resources, WorkerInfo

runner = CliRunner()


def simulate(*args: str) -> Result:
    return runner.invoke(cli.app, ["simulate", *args])


SOUQ_TOML = """
app = "web"
primary_region = "mad"
[processes]
app = "python3 server.py"
[http_service]
internal_port = 8080
[[vm]]
cpus = 2
memory_mb = 512
"""


class Workers:
    """A client that lists two workers of 4 cpus, one of them full, and no machines."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def workers(self) -> list[WorkerInfo]:
        self.calls.append("workers")
        return [
            WorkerInfo(
                id=worker_id,
                region="mad",
                capacity=Resources(cpus=4, memory_mb=4096),
                allocated=Resources(cpus=used, memory_mb=0),
            )
            for worker_id, used in (("full", 4), ("free", 0))
        ]

    def list_machines(self, app: str) -> list[Any]:
        self.calls.append(f"list {app}")
        return []


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Workers:
    stub = Workers()
    monkeypatch.setattr(cli, "make_client", lambda: stub)
    return stub


def test_a_batch_that_fits_is_shown_as_dry_runs_and_exits_0(client: Workers) -> None:
    result = simulate("--from-cluster", "--region", "mad", "--cpus", "2", "-n", "2")
    assert result.exit_code == 0, result.output
    assert "machine 1 of 2 (what-if, 2 cpus / 256 MiB in mad): worker free" in result.output
    assert "placement (best-fit)" in result.output and "winner free" in result.output
    assert "2 of 2 would be placed on 2 workers. Nothing was created." in result.output
    assert client.calls == ["workers"]  # no app named: no machines asked for


def test_what_does_not_fit_is_said_and_exits_3(client: Workers) -> None:
    args = ["--from-cluster", "-r", "mad", "--cpus", "2", "--count", "3", "--app", "web"]
    result = simulate(*args, "--json")
    assert result.exit_code == 3
    body = json.loads(result.stdout)
    assert [m["worker"] for m in body["machines"]] == ["free", "free", None]
    assert body["reasons"] == {"insufficient_cpu": 1}
    assert client.calls == ["list web", "workers"]


def test_a_deploy_plan_from_souq_toml(client: Workers, tmp_path: Path) -> None:
    (tmp_path / "souq.toml").write_text(SOUQ_TOML)
    result = simulate("--from-cluster", "--config", str(tmp_path / "souq.toml"))
    assert result.exit_code == 0, result.output
    # Two machines of a group with services, 2 cpus each: one worker has room for both.
    assert "machine 1 of 2 (web app, 2 cpus / 512 MiB in mad): worker free" in result.output
    assert "machine 2 of 2 (web app, 2 cpus / 512 MiB in mad): worker free" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from-cluster", "--cpus", "1"], "--from-cluster needs --region"),
        (["--from-cluster", "--config", "x.toml", "-r", "mad"], "--config plans the machines"),
        (["--from-cluster", "--config", "nowhere.toml"], "cannot read nowhere.toml"),
        (["--from-cluster", "-r", "mad", "--gpus", "1", "--gpu-milli", "5"], "gpu_milli"),
        (["--from-cluster", "-r", "mad", "--policy", "worst"], "unknown policy 'worst'"),
        (["--from-cluster", "-r", "mad", "-p", "fgd", "-p", "spread"], "with one --policy"),
        (["--from-cluster", "--tasks", "t.csv"], "two simulations: give one"),
        (["--tasks", "t.csv", "--nodes", "n.csv"], "--nodes and --pods are the openb form"),
        (["--from-cluster", "-r", "syd"], "region 'syd' is unknown; known regions: mad"),
        (["--tasks", "t.csv"], "--tasks needs --workers"),
        (["--tasks", "t.csv", "--workers", "lots"], "workers 'lots' is not"),
    ],
)
def test_bad_options_are_named_with_a_hint(client: Workers, args: list[str], message: str) -> None:
    result = simulate(*args)
    assert result.exit_code == 1, result.output
    assert message in result.output


def test_a_trace_replays_on_the_workers_given(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.csv"
    tasks.write_text(
        "name,arrival_s,duration_s,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "a,0,10,4000,1024,0,0,\n"
        "b,5,10,4000,1024,0,0,\n"
        "c,20,10,4000,1024,0,0,\n"
    )
    args = ["--tasks", str(tasks), "--workers", "1x4/4G"]
    result = simulate(*args)
    assert result.exit_code == 0, result.output
    assert "3 on 1 workers: 2 placed, 1 failed" in result.output
    assert "1 insufficient_cpu" in result.output
    body = json.loads(simulate(*args, "--json", "--policy", "spread").stdout)
    assert (body["policy"], body["placed"], body["failed"]) == ("spread", 2, 1)
    assert [s["running"] for s in body["samples"]] == [1, 1, 0, 1, 0]


def test_openb_pods_and_nodes_are_read_as_they_are(tmp_path: Path) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,8000,8192,2,T4\n")
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time\n"
        "p1,4000,1024,1,500,,0,100\n"
        "p2,4000,1024,1,500,,100,200\n"
    )
    args = ["--tasks", str(pods), "--workers", str(nodes), "--speedup", "10", "--json"]
    body = json.loads(simulate(*args).stdout)
    assert (body["workers"], body["placed"], body["failed"]) == (1, 2, 0)
    assert body["samples"][0] == {
        "t": 0.001,
        "running": 1,
        "cpu": 50.0,
        "memory": 12.5,
        "gpu": 25.0,
        "worker_cpu_p50": 50.0,
        "worker_cpu_p95": 50.0,
        "worker_cpu_max": 50.0,
    }


def test_a_trace_replays_once_per_policy(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.csv"
    tasks.write_text(
        "name,arrival_s,duration_s,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        + "".join(f"s{i},{i},100,1000,1024,1,{250 * (1 + i % 3)},\n" for i in range(12))
    )
    args = ["--tasks", str(tasks), "--workers", "3x8/8G/2:T4", "--json"]
    result = simulate(*args, "-p", "souq", "-p", "fgd", "-p", "gpupacking")
    assert result.exit_code == 0, result.output
    bodies = json.loads(result.stdout)
    assert [b["policy"] for b in bodies] == ["best-fit", "fgd", "gpupacking"]
    assert all(b["placed"] + b["failed"] == 12 for b in bodies)
    people = simulate(*args[:-1], "-p", "binpack", "-p", "spread").output
    assert people.count("policy ") == 2 and "spread" in people
