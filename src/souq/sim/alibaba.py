"""Alibaba's ``cluster-trace-v2017`` batch tasks as generic tasks.

The trace's ``batch_task.csv`` has no header; its columns are ``create_timestamp``,
``modify_timestamp`` (the task's end), ``job_id``, ``task_id``, ``instance_num``, ``status``,
``plan_cpu`` (hundredths of a core per instance: 50 is half a core) and ``plan_mem`` (memory
per instance as a share of a host's, normalised: 0.01 is 1 % of a host). Times are seconds from
the trace's start. Each row becomes one :class:`~souq.sim.traces.Task` of ``instance_num``
instances that arrive at ``create_timestamp`` and hold their resources until
``modify_timestamp`` (the trace has no per-instance times here: every instance is taken to run
the task's span). A row with no plan (a task that never ran: ``Waiting``) is left out.

``traces/alibaba-v2017_batch_task_sample.csv`` is a small sample; traces/README.md says where it
comes from and on what terms.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from souq.errors import TraceInvalid
from souq.sim.traces import MILLI, Task, _Row

__all__ = ["BATCH_TASK_COLUMNS", "parse_batch_tasks", "read_batch_tasks"]

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
_HEADER = {name: i for i, name in enumerate(BATCH_TASK_COLUMNS)}


def parse_batch_tasks(
    text: str | Iterable[str], source: str = "<batch_task>", *, host_memory_mib: int
) -> list[Task]:
    """The rows of a ``batch_task.csv`` as tasks; ``plan_mem`` scaled by ``host_memory_mib``
    (the memory of the hosts the shares are of)."""
    lines = text.splitlines() if isinstance(text, str) else text
    reader = csv.reader(lines)
    tasks: list[Task] = []
    for cells in reader:
        if not cells or all(not c.strip() for c in cells):
            continue
        row = _Row(source, reader.line_num, _HEADER, cells)
        if len(cells) != len(BATCH_TASK_COLUMNS):
            raise TraceInvalid(
                f"{source}, line {row.line}: {len(cells)} cells, a batch task has "
                f"{len(BATCH_TASK_COLUMNS)} ({', '.join(BATCH_TASK_COLUMNS)})",
                hint="the trace's batch_task.csv as published, without a header",
                details={"file": source, "line": row.line},
            )
        if not row.text("plan_cpu") or not row.text("plan_mem"):
            continue
        start = row.seconds("create_timestamp", optional=False, negative=True)
        end = row.seconds("modify_timestamp", optional=False, negative=True)
        assert start is not None
        assert end is not None
        if end < start:
            raise row.error("modify_timestamp", f"{end:g} is before the task's creation")
        job = row.text("job_id")
        tasks.append(
            Task(
                name=f"{job}/{row.text('task_id')}",
                arrival_s=start,
                duration_s=end - start,
                cpu_milli=row.amount("plan_cpu", MILLI / 100),
                memory_mib=row.amount("plan_mem", host_memory_mib),
                instances=row.integer("instance_num", low=1),
                job=job,
            )
        )
    return tasks


def read_batch_tasks(path: str | Path, *, host_memory_mib: int) -> list[Task]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceInvalid(f"{p}: cannot read the trace: {e}", details={"file": str(p)}) from e
    return parse_batch_tasks(text, str(p), host_memory_mib=host_memory_mib)
