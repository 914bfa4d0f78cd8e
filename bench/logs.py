"""Machine output (``python -m bench logs``): how fast a machine can print through Souq (its
souq-waiter's pipe, copied into the bounded log as it comes: docs/limits.md) against the same
program writing to a file directly, in the same run, on the same file system.

Two writers, each printing ``SIZE_MB`` MiB as fast as it can: ``dd`` in 64 KiB writes (a bulk
writer) and in 512-byte writes (a chatty one, a line or so per write). Each round runs both
ways, interleaved: **direct**, the program as a child of this process with its stdout and
stderr appended to a file (the floor: no pipe, no copy, no bound), and **souq**, the same
program as a machine of a real cluster (``souq.testing.Cluster``: nats-server, one agent, one
broker), its log bounded at the default 4 MiB. The program times itself (``date +%s.%N``
before and after, written to a file of its own), so the figures are the writer's: from its
first write to its last, creation and scheduling left out. CPU: the writer's (``dd`` and its
shell) and, through Souq, its souq-waiter's, which does the copying; per MiB written.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.stats import machine_line
from souq.model import MachineState
from souq.testing import Cluster, wait_until

SIZE_MB = 300
ROUNDS = 5
WRITERS = {"64 KiB writes": 64 * 1024, "512 B writes": 512}
MiB = 1 << 20


def _script(block: int, timing: Path | str) -> str:
    count = SIZE_MB * MiB // block
    return (
        f"t0=$(date +%s.%N); dd if=/dev/zero bs={block} count={count} status=none; "
        f't1=$(date +%s.%N); echo "$t0 $t1" > {timing}.tmp; mv {timing}.tmp {timing}; '
        "exec sleep 600"
    )


def _elapsed(timing: Path) -> float:
    t0, t1 = (float(w) for w in timing.read_text().split())
    return t1 - t0


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def _direct(root: Path, block: int) -> dict[str, float]:
    """The floor: the program's output appended to a file, no one in between."""
    timing = root / "direct.time"
    timing.unlink(missing_ok=True)
    log = root / "direct.log"
    log.unlink(missing_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    pid = os.posix_spawn(
        "/bin/sh",
        ["sh", "-c", _script(block, timing).replace("exec sleep 600", "true")],
        dict(os.environ),
        file_actions=[(os.POSIX_SPAWN_DUP2, fd, 1), (os.POSIX_SPAWN_DUP2, fd, 2)],
    )
    os.close(fd)
    os.waitpid(pid, 0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    seconds = _elapsed(timing)
    log.unlink()
    return {"s": seconds, "mb_s": SIZE_MB / seconds, "cpu_ms_per_mb": cpu * 1000 / SIZE_MB}


def _souq(cluster: Cluster, block: int) -> dict[str, float]:
    """The same program as a machine: its output through its souq-waiter into its log."""
    (agent,) = cluster.agents
    client = cluster.client()
    m = client.create_machine(
        "logs", "mad", {"cmd": ["sh", "-c", _script(block, "elapsed")], "restart": {"policy": "no"}}
    )
    assert m.state is MachineState.STARTED and m.pid
    timing = agent.data_dir / "machines" / m.id / "elapsed"
    wait_until(timing.exists, timeout=300, message="the writer to finish")
    shell = psutil.Process(m.pid)
    waiter = shell.parent()
    assert waiter is not None
    writer_cpu, waiter_cpu = _cpu(shell), _cpu(waiter)
    seconds = _elapsed(timing)
    records = agent.data_dir / "machines" / ".agent" / m.id
    on_disk = sum(f.stat().st_size for f in records.iterdir() if f.is_file())
    client.destroy("logs", m.id, force=True)
    return {
        "s": seconds,
        "mb_s": SIZE_MB / seconds,
        "cpu_ms_per_mb": writer_cpu * 1000 / SIZE_MB,
        "waiter_cpu_ms_per_mb": waiter_cpu * 1000 / SIZE_MB,
        "log_bytes_on_disk": on_disk,
    }


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}


def logs() -> dict[str, Any]:
    out: dict[str, Any] = {"machine": machine_line(), "size_mb": SIZE_MB, "rounds": ROUNDS}
    with tempfile.TemporaryDirectory(prefix="souq-bench-logs-") as tmp:
        root = Path(tmp)
        with Cluster(root / "cluster", regions={"mad": 1}) as cluster:
            for label, block in WRITERS.items():
                direct: list[dict[str, float]] = []
                souq: list[dict[str, float]] = []
                for _ in range(ROUNDS):
                    direct.append(_direct(root, block))
                    souq.append(_souq(cluster, block))
                    print(label, json.dumps({"direct": direct[-1], "souq": souq[-1]}), flush=True)
                d, s = _median(direct), _median(souq)
                out[label] = {
                    "direct": d,
                    "souq": s,
                    "throughput_ratio": round(s["mb_s"] / d["mb_s"], 3),
                    "cpu_ratio": round(
                        (s["cpu_ms_per_mb"] + s["waiter_cpu_ms_per_mb"]) / d["cpu_ms_per_mb"], 3
                    ),
                }
    return out


def main() -> None:
    started = time.monotonic()
    out = logs()
    out["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out, indent=2))
    path = Path("bench/results")
    path.mkdir(parents=True, exist_ok=True)
    (path / "logs.json").write_text(json.dumps(out, indent=2))
