"""``souq simulate --tasks`` with priority classes: the class lines, ``--preempt`` and
``--compare-preemption`` from the command line, both engines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from souq.client import cli

runner = CliRunner()


def simulate(*args: str) -> Result:
    return runner.invoke(cli.app, ["simulate", *args])


def _trace(tmp_path: Path) -> Path:
    tasks = tmp_path / "mix.csv"
    tasks.write_text(
        "name,arrival_s,duration_s,cpus,memory_mib,priority_class,max_price\n"
        "web-1,0,600,8,4096,reserved,\n"
        "batch-1,5,900,8,4096,spot,0.02\n"
        "batch-2,6,900,8,4096,spot,0.05\n"
        "web-2,60,600,8,4096,reserved,\n"
        "web-3,70,600,8,4096,reserved,\n"
    )
    return tasks


@pytest.mark.parametrize("engine", [["--engine", "cluster"], ["--engine", "fleet"]])
def test_a_replay_tells_what_each_class_saw(tmp_path: Path, engine: list[str]) -> None:
    args = ["--tasks", str(_trace(tmp_path)), "--workers", "2x16/16G", *engine]
    body = json.loads(simulate(*args, "--json").stdout)
    assert body["preempt_max_victims"] == 8
    reserved, spot = body["classes"]["reserved"], body["classes"]["spot"]
    assert (reserved["refused"], reserved["preempted"]) == (0, 0)
    assert (spot["preempted"], spot["placed_again"]) == (1, 1)
    people = simulate(*args).output
    assert "at most 8 machines a create; 1 displaced" in people
    off = json.loads(simulate(*args, "--preempt", "0", "--json").stdout)
    assert off["classes"]["reserved"]["refused"] == 1


@pytest.mark.parametrize("engine", [["--engine", "cluster"], ["--engine", "fleet"]])
def test_the_comparison_prints_three_runs(tmp_path: Path, engine: list[str]) -> None:
    args = ["--tasks", str(_trace(tmp_path)), "--workers", "2x16/16G", *engine]
    body = json.loads(simulate(*args, "--compare-preemption", "--json").stdout)
    alone, off, on = body["arms"]
    assert [a["arm"] for a in body["arms"]] == ["reserved only", "no preemption", "preemption"]
    assert (alone["reserved_refused"], off["reserved_refused"], on["reserved_refused"]) == (0, 1, 0)
    assert on["window_s"] == alone["window_s"] == [0.0, 70.0]
    assert on["window_utilisation"]["cpu"] > alone["window_utilisation"]["cpu"]
    people = simulate(*args, "--compare-preemption").output
    assert "What preemption buys" in people and "preemption (at most 8)" in people


def test_an_unknown_class_in_the_trace_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("name,arrival_s,cpus,memory_mib,priority_class\na,0,1,512,gold\n")
    result = simulate("--tasks", str(bad), "--workers", "1x4/4G")
    assert result.exit_code == 1
    assert "column 5 (priority_class): 'gold' is not a priority class" in result.output
