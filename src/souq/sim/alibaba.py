"""Alibaba's ``cluster-trace-v2017`` and ``cluster-trace-v2018`` batch tasks as generic tasks.

The trace's ``batch_task.csv`` has no header; its columns are ``create_timestamp``,
``modify_timestamp`` (the task's end), ``job_id``, ``task_id``, ``instance_num``, ``status``,
``plan_cpu`` (hundredths of a core per instance: 50 is half a core) and ``plan_mem`` (memory
per instance as a share of a host's, normalised: 0.01 is 1 % of a host). Times are seconds from
the trace's start. Each row becomes one :class:`~souq.sim.traces.Task` of ``instance_num``
instances that arrive at ``create_timestamp`` and hold their resources until
``modify_timestamp`` (the trace has no per-instance times here: every instance is taken to run
the task's span). A row with no plan (a task that never ran: ``Waiting``) is left out.

``cluster-trace-v2018``'s ``batch_task.csv`` (no header either) has ``task_name``,
``instance_num``, ``job_name``, ``task_type``, ``status``, ``start_time``, ``end_time``,
``plan_cpu`` (hundredths of a core) and ``plan_mem`` (memory as a percentage of a host's,
"normalised [0, 100]": 0.5 is half a percent); read the same way (:func:`parse_batch_tasks_v2018`).

``traces/alibaba-v2017_batch_task_sample.csv`` is a small sample; traces/README.md says where it
comes from and on what terms.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from souq.errors import TraceInvalid
from souq.sim.traces import MILLI, Task, _lines_as_rows

__all__ = [
    "BATCH_TASK_COLUMNS",
    "BATCH_TASK_V2018_COLUMNS",
    "parse_batch_tasks",
    "parse_batch_tasks_v2018",
    "read_batch_tasks",
]

BATCH_TASK_COLUMNS = (
    "create_timestamp",
    "modify_timestamp",
    "job_id",
    "task_id",
    "instance_num",
    "status",
    "plan_cpu",
    "plan_mem",
)
BATCH_TASK_V2018_COLUMNS = (
    "task_name",
    "instance_num",
    "job_name",
    "task_type",
    "status",
    "start_time",
    "end_time",
    "plan_cpu",
    "plan_mem",
)
# Per version: its columns, and the names of its start, end, job and task, and what a plan_mem
# of 1 is of a host's memory.
_FORMS = {
    2017: (BATCH_TASK_COLUMNS, "create_timestamp", "modify_timestamp", "job_id", "task_id", 1.0),
    2018: (BATCH_TASK_V2018_COLUMNS, "start_time", "end_time", "job_name", "task_name", 0.01),
}


def parse_batch_tasks(
    text: str | Iterable[str],
    source: str = "<batch_task>",
    *,
    host_memory_mib: int,
    version: int = 2017,
) -> list[Task]:
    """The rows of a ``batch_task.csv`` as tasks; ``plan_mem`` scaled by ``host_memory_mib``
    (the memory of the hosts the shares are of)."""
    columns, start_col, end_col, job_col, task_col, share = _FORMS[version]
    header = {name: i for i, name in enumerate(columns)}
    lines = text.splitlines() if isinstance(text, str) else text
    reader = csv.reader(lines)
    tasks: list[Task] = []
    rows = _lines_as_rows(
        reader,
        source,
        header,
        width=len(columns),
        width_is=f"a v{version} batch task has {len(columns)} ({', '.join(columns)})",
        hint="the trace's batch_task.csv as published, without a header",
    )
    for row in rows:
        if not row.text("plan_cpu") or not row.text("plan_mem"):
            continue
        start = row.seconds(start_col, optional=False, negative=True)
        end = row.seconds(end_col, optional=False, negative=True)
        assert start is not None
        assert end is not None
        if end < start:
            raise row.error(end_col, f"{end:g} is before the task's start")
        job = row.text(job_col)
        tasks.append(
            Task(
                name=f"{job}/{row.text(task_col)}",
                arrival_s=start,
                duration_s=end - start,
                cpu_milli=row.amount("plan_cpu", MILLI / 100),
                memory_mib=row.amount("plan_mem", host_memory_mib * share),
                instances=row.integer("instance_num", low=1),
                job=job,
            )
        )
    return tasks


def parse_batch_tasks_v2018(
    text: str | Iterable[str], source: str = "<batch_task>", *, host_memory_mib: int
) -> list[Task]:
    """``cluster-trace-v2018``'s batch tasks (``plan_mem`` a percentage of a host's memory)."""
    return parse_batch_tasks(text, source, host_memory_mib=host_memory_mib, version=2018)


def read_batch_tasks(path: str | Path, *, host_memory_mib: int, version: int = 2017) -> list[Task]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceInvalid(f"{p}: cannot read the trace: {e}", details={"file": str(p)}) from e
    return parse_batch_tasks(text, str(p), host_memory_mib=host_memory_mib, version=version)
