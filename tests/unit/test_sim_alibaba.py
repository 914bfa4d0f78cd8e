"""The Alibaba cluster-trace-v2017 sample (traces/) read as published and replayed on a fleet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from souq.client import cli
from souq.errors import TraceInvalid
from souq.model.policy import PlacementDefaults
from souq.model.resources import Resources
from souq.placement import build_pipeline
from souq.sim.alibaba import parse_batch_tasks, parse_batch_tasks_v2018, read_batch_tasks
from souq.sim.fleet import Settings, replay_fleet

SAMPLE = Path(__file__).parents[2] / "traces" / "alibaba-v2017_batch_task_sample.csv"
HOST = Resources(cpus=64, memory_mb=65536)


def test_the_sample_reads_as_tasks_of_many_instances() -> None:
    tasks = read_batch_tasks(SAMPLE, host_memory_mib=65536)
    assert len(tasks) == 61  # the two Waiting rows have no plan
    assert sum(t.instances for t in tasks) == 35_291
    first = tasks[0]
    assert (first.name, first.job, first.arrival_s, first.duration_s) == ("3/4", "3", 6459.0, 65.0)
    assert (first.cpu_milli, first.memory_mib, first.instances) == (500, 522, 15_740)


def test_a_bad_row_is_blamed_by_file_line_and_column() -> None:
    with pytest.raises(TraceInvalid, match=r"b.csv, line 2, column 7 \(plan_cpu\): 'half'"):
        parse_batch_tasks(
            "1,2,3,4,1,Terminated,50,0.1\n1,2,3,4,1,Terminated,half,0.1\n",
            "b.csv",
            host_memory_mib=1024,
        )


def test_on_sixty_hosts_the_queue_turns_failures_into_waits() -> None:
    tasks = read_batch_tasks(SAMPLE, host_memory_mib=65536)
    pipeline = build_pipeline(None, PlacementDefaults())
    hosts = [HOST] * 60
    failing = replay_fleet(hosts, tasks, pipeline=pipeline, settings=Settings(batch=False))
    assert failing.failed > 0 and set(failing.failed_by_reason) == {"insufficient_memory"}
    waiting = replay_fleet(
        hosts, tasks, pipeline=pipeline, settings=Settings(batch=False, queue=True)
    )
    assert (waiting.placed, waiting.failed) == (35_291, 0)
    assert 0 < waiting.waits["p95"] <= waiting.waits["max"]
    assert waiting.jobs["slowdown_mean"] > 1
    assert set(waiting.utilisation) == {"cpu", "memory"}  # no GPU on a CPU-only fleet
    # As one batch each, the 15,740 instances of task 3/4 (8 TiB) never fit 60 hosts (3.75 TiB).
    batched = replay_fleet(hosts, tasks, pipeline=pipeline, settings=Settings(queue=True))
    assert batched.failed_by_reason == {"never_fits": 15_740}


def test_v2018_batch_tasks_read_plan_mem_as_a_percentage(tmp_path: Path) -> None:
    text = (
        "M1,1,j_1,1,Terminated,157297,157325,100,0.49\n"
        "R2_1,300,j_2,1,Terminated,100,400,50,1.5\n"
        "M3,5,j_3,1,Waiting,0,0,,\n"
    )
    tasks = parse_batch_tasks_v2018(text, "b.csv", host_memory_mib=100_000)
    assert [(t.name, t.instances, t.cpu_milli, t.memory_mib, t.duration_s) for t in tasks] == [
        ("j_1/M1", 1, 1000, 490, 28.0),
        ("j_2/R2_1", 300, 500, 1500, 300.0),
    ]
    trace = tmp_path / "batch_task.csv"
    trace.write_text(text)
    result = CliRunner().invoke(
        cli.app,
        [
            "simulate",
            "--tasks",
            str(trace),
            "--workers",
            "2x96/100000",
            "--engine",
            "fleet",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["instances"] == 301
