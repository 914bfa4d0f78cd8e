"""The openb trace and the generic trace as typed records; bad rows are blamed precisely."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.openb import NODES, PODS

from souq.errors import InvalidInput, TraceInvalid
from souq.sim.traces import (
    Task,
    parse_nodes,
    parse_pods,
    parse_tasks,
    read_nodes,
    read_pods,
    tasks_from_pods,
)
from souq.sim.workload import gpu_nodes

needs_traces = pytest.mark.skipif(not PODS.exists(), reason="the openb trace is not here")

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)


@needs_traces
def test_the_openb_nodes_load_and_the_gpu_nodes_match_the_paper() -> None:
    nodes = read_nodes(NODES)
    assert len(nodes) == 1523
    gpu = gpu_nodes(nodes)
    assert len(gpu) == 1213
    assert sum(n.gpus for n in gpu) == 6212
    assert sum(n.cpu_milli for n in gpu) == 107_018_000
    assert sum(n.memory_mib for n in gpu) == 503_828_480
    assert sum(1 for n in gpu if n.model == "G2") == 549


@needs_traces
def test_the_openb_pods_load_with_their_gpu_requests() -> None:
    pods = read_pods(PODS)
    assert len(pods) == 8152
    assert sum(1 for p in pods if p.num_gpu == 0) == 1088
    assert sum(1 for p in pods if p.num_gpu == 1) == 6989
    assert sum(1 for p in pods if p.shares_gpu) == 3078
    assert [sum(1 for p in pods if p.num_gpu == k) for k in (2, 4, 8)] == [16, 15, 44]
    assert sum(p.gpu_request_milli for p in pods) == 6_086_800
    assert pods[1].gpu_milli == 460
    assert pods[1].deletion_time == 12_902_960


def test_a_bad_cell_names_the_file_line_and_column() -> None:
    text = (
        f"{POD_HEADER}\np0,1000,10,1,500,,LS,Running,0,5,0\np1,1000,10,one,500,,LS,Running,0,5,0\n"
    )
    with pytest.raises(TraceInvalid) as e:
        parse_pods(text, "pods.csv")
    assert "pods.csv, line 3, column 4 (num_gpu)" in e.value.message
    assert e.value.details == {"file": "pods.csv", "line": 3, "column": "num_gpu"}
    assert isinstance(e.value, InvalidInput)
    assert e.value.to_body()["status"] == "trace_invalid"


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("p,1000,10,2,500,,LS,Running,0,5,0", "gpu_milli"),  # a multi-GPU pod shares no GPU
        ("p,1000,10,0,300,,LS,Running,0,5,0", "gpu_milli"),
        ("p,1000,10,1,1200,,LS,Running,0,5,0", "gpu_milli"),
        ("p,-5,10,1,100,,LS,Running,0,5,0", "cpu_milli"),
        ("p,1000,10,1,100,,LS,Running,soon,5,0", "creation_time"),
    ],
)
def test_rows_out_of_range_are_refused(row: str, column: str) -> None:
    with pytest.raises(TraceInvalid) as e:
        parse_pods(f"{POD_HEADER}\n{row}\n", "x.csv")
    assert e.value.details["column"] == column
    assert e.value.details["line"] == 2


def test_a_missing_column_or_a_short_row_is_refused() -> None:
    with pytest.raises(TraceInvalid, match="lacks gpu, model"):
        parse_nodes("sn,cpu_milli,memory_mib\nn,1,1\n", "n.csv")
    with pytest.raises(TraceInvalid, match="line 2: 3 cells"):
        parse_nodes("sn,cpu_milli,memory_mib,gpu,model\nn,1,1\n", "n.csv")
    with pytest.raises(TraceInvalid, match="empty"):
        parse_nodes("", "n.csv")


def test_a_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceInvalid, match="cannot read"):
        read_nodes(tmp_path / "absent.csv")


def test_the_generic_trace_keeps_arrivals_and_durations() -> None:
    text = (
        "name,arrival_s,duration_s,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "a,0,60,2000,1024,1,250,T4|A10\n"
        "b,1.5,,1000,512,0,0,\n"
    )
    a, b = parse_tasks(text, "t.csv")
    assert a == Task("a", 0.0, 60.0, 2000, 1024, 1, 250, ("T4", "A10"))
    assert b.duration_s is None
    assert a.pod().deletion_time == 60
    assert b.pod().deletion_time is None
    with pytest.raises(TraceInvalid, match="column 3"):
        parse_tasks(text.replace(",60,", ",-1,"), "t.csv")


def test_openb_pods_become_generic_tasks() -> None:
    pods = parse_pods(f"{POD_HEADER}\np0,1000,10,1,500,,LS,Running,100,160,100\n")
    (task,) = tasks_from_pods(pods)
    assert (task.arrival_s, task.duration_s, task.gpu_milli) == (100.0, 60.0, 500)


def test_a_task_row_carries_instances_a_stagger_and_a_job() -> None:
    tasks = parse_tasks(
        "name,arrival_s,duration_s,cpus,memory_mib,instances,stagger_s,job\n"
        "early,-30,60,0.25,100.5,60000,,j1\n"
        "late,5.5,,2,512,3,0.5,j1\n"
    )
    assert tasks[0] == Task("early", -30.0, 60.0, 250, 101, instances=60000, job="j1")
    assert tasks[1].instances == 3 and tasks[1].stagger_s == 0.5 and tasks[1].num_gpu == 0
    assert tasks[1].last_arrival_s == 6.5


def test_fractional_millicores_round_up_and_the_gpu_columns_may_be_left_out() -> None:
    (task,) = parse_tasks("name,arrival_s,cpu_milli,memory_mib\nt,0,0.5,0.1\n")
    assert (task.cpu_milli, task.memory_mib, task.num_gpu, task.duration_s) == (1, 1, 0, None)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("t,0,x,1,1", "line 2, column 3 (cpus): 'x' is not a number"),
        ("t,0,1,-1,1", "line 2, column 4 (memory_mib): -1 is out of range"),
        ("t,0,1,1,0", "line 2, column 5 (instances): 0 is out of range"),
        ("t,inf,1,1,1", "line 2, column 2 (arrival_s): 'inf' is not a finite number"),
    ],
)
def test_bad_cells_of_the_new_columns_are_blamed(row: str, message: str) -> None:
    with pytest.raises(TraceInvalid) as caught:
        parse_tasks(f"name,arrival_s,cpus,memory_mib,instances\n{row}\n", "t.csv")
    assert str(caught.value).startswith("t.csv, ") and message in str(caught.value)


def test_a_trace_without_a_cpu_column_is_refused_naming_both() -> None:
    with pytest.raises(TraceInvalid, match="lacks cpu_milli or cpus"):
        parse_tasks("name,arrival_s,memory_mib\nt,0,1\n", "t.csv")
