"""``souq simulate --tasks ... --engine fleet``: the fleet replay from the command line."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from souq.client import cli

runner = CliRunner()
SAMPLE = Path(__file__).parents[2] / "traces" / "alibaba-v2017_batch_task_sample.csv"


def simulate(*args: str) -> Result:
    return runner.invoke(cli.app, ["simulate", *args])


def _trace(tmp_path: Path) -> Path:
    tasks = tmp_path / "tasks.csv"
    tasks.write_text(
        "name,arrival_s,duration_s,cpus,memory_mib,instances,job\n"
        "a,-10,20,1,512,4,j\n"
        "b,0,10,1,512,4,j\n"
    )
    return tasks


def test_a_queue_makes_the_second_batch_wait(tmp_path: Path) -> None:
    args = ["--tasks", str(_trace(tmp_path)), "--workers", "1x4/4G", "--engine", "fleet"]
    body = json.loads(simulate(*args, "--json").stdout)
    assert (body["placed"], body["failed"], body["failed_by_reason"]) == (
        4,
        4,
        {"insufficient_cpu": 4},
    )
    assert set(body["utilisation"]) == {"cpu", "memory"}
    queued = json.loads(simulate(*args, "--queue", "--json").stdout)
    assert (queued["placed"], queued["failed"]) == (8, 0)
    assert queued["waits"]["max"] == 10.0 and queued["span_s"] == [-10.0, 20.0]
    assert queued["jobs"]["slowdown_max"] == 1.5  # 30 s against 20 s
    people = simulate(*args, "--queue").output
    assert "waits" in people and "p95 10 s" in people and "gpu" not in people


def test_the_alibaba_batch_tasks_are_read_as_published(tmp_path: Path) -> None:
    args = ["--tasks", str(SAMPLE), "--workers", "60x64/64G", "--engine", "fleet"]
    body = json.loads(simulate(*args, "--one-by-one", "--queue", "--json").stdout)
    assert (body["instances"], body["placed"], body["batch"]) == (35_291, 35_291, False)
    figure = tmp_path / "timeline.png"
    result = simulate(*args, "--one-by-one", "--queue", "--plot", str(figure))
    assert result.exit_code == 0, result.output
    assert figure.stat().st_size > 10_000


def test_fleet_options_need_the_fleet_engine(tmp_path: Path) -> None:
    result = simulate("--tasks", str(_trace(tmp_path)), "--workers", "1x4/4G", "--queue")
    assert result.exit_code == 1
    assert "--queue and --plot are the fleet engine's" in result.output
    result = simulate("--tasks", "t.csv", "--workers", "1x4/4G", "--engine", "warp")
    assert result.exit_code == 1 and "unknown engine 'warp'" in result.output


def test_the_cluster_engine_takes_instances_and_arrivals_before_the_trace(tmp_path: Path) -> None:
    args = ["--tasks", str(_trace(tmp_path)), "--workers", "1x4/4G", "--json"]
    body = json.loads(simulate(*args).stdout)
    assert (body["tasks"], body["placed"], body["failed"]) == (8, 4, 4)
    assert body["failed_by_reason"] == {"insufficient_cpu": 4}  # b's batch, all or none
    assert body["samples"][0]["t"] <= -9.9
    assert [s["running"] for s in body["samples"]][:2] == [4, 4]  # a's batch in one create
    single = json.loads(simulate(*args, "--one-by-one").stdout)
    assert (single["placed"], single["failed"]) == (4, 4)
    assert [s["running"] for s in single["samples"]][:4] == [1, 2, 3, 4]


def test_backfill_is_a_rule_of_the_queue(tmp_path: Path) -> None:
    args = ["--tasks", str(_trace(tmp_path)), "--workers", "1x4/4G", "--engine", "fleet"]
    result = simulate(*args, "--backfill")
    assert result.exit_code == 1 and "--backfill is a rule of the queue" in result.output
    body = json.loads(simulate(*args, "--queue", "--backfill", "--json").stdout)
    assert (body["backfill"], body["placed"]) == (True, 8)
