"""Supervision (``python -m bench supervise``): one Souq agent against supervisord and circus,
side by side in one run, each supervising ``sleep`` programs on this host.

Three phases, each supervisor on a fresh daemon in every phase (see docs/benchmarks.md,
"Supervision: Souq against supervisord and circus"):

1. **warm start** — every daemon launched (its programs started and stopped again), then
   ``ROUNDS`` rounds, interleaved: in each round each daemon in turn gets the one request that
   starts its 100 programs (timed until all 100 run, and until the request is answered), then
   stops them. Only one daemon's programs run at a time.
2. **restart** — one daemon at a time with 100 programs running: ``kill -9`` of one program's
   process, timed until that program's new process runs; each program once. Between kills,
   ``SETTLE_S`` plus a random part of the daemon's own timer period (``Variant.period_s``), so
   that kills do not fall in step with a daemon that checks its processes periodically (circus
   would otherwise show its worst case every time).
3. **memory** — one daemon at a time, launched and given 100, then (another daemon) 1,000
   programs: its resident set (and USS) ``MEMORY_SETTLE_S`` after all started, and its CPU use
   over the next ``CPU_WINDOW_S``. Souq's per-machine ``souq-waiter`` processes are counted apart.

Every launch is also a **cold start** sample: from launching the daemon until all its programs
run (for Souq, the agent's launch, then ``claim_batch`` requests as soon as it is ready).

"Runs" means the program's ``execve`` completed, as the kernel reports it (bench/procevents.py):
one stopwatch for all three, which none of them can see or be slowed by.

For a quicker look, ``SUPERVISE_ONLY`` names the variants to run (labels separated by ``|``,
e.g. ``souq|souq, no cgroups``) and ``SUPERVISE_PHASES`` the phases (``warm,restart,memory``);
such a run writes bench/results/supervise.partial.json instead of supervise.json.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xmlrpc.client
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

import souq
from bench.procevents import ProcEvents
from bench.stats import machine_line, summary_ms
from bench.supervisors import Circusd, Daemon, SouqAgent, Supervisord, rss_mb
from souq.natsserver import NatsServer, nats_server_binary

SMALL, LARGE = 100, 1000
ROUNDS = 7  # warm starts of 100, per daemon
SETTLE_S = 0.1  # between two kills: the supervisor's after-work must not overlap the next
MEMORY_SETTLE_S = 2.0
CPU_WINDOW_S = 5.0
RESTART_BUDGET_S = 90.0  # per supervisor: kills stop after this, once MIN_KILLS are done
MIN_KILLS = 20
POLL_S = 0.005  # the "polled" supervisord: getState this often during its kills
START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Variant:
    """One supervisor as configured for a row of the tables."""

    label: str
    make: Callable[[Path, str], Daemon]
    kills: int  # restarts to time (fewer if RESTART_BUDGET_S runs out first)
    period_s: float  # the daemon's own timer: heartbeat, poll timeout or check_delay
    warm: bool = True  # in the warm-start phase
    memory: bool = True  # in the memory phase
    poll: bool = False  # a client polls the daemon during the kills (supervisord only)


def _variants(nats_url: str) -> list[Variant]:
    def souq(backoff_s: float = 0.0, **options: Any) -> Callable[[Path, str], Daemon]:
        return lambda root, marker: SouqAgent(
            root, marker, nats_url, backoff_s=backoff_s, options=options
        )

    return [
        # The agent's heartbeat: every second.
        Variant("souq", souq(), kills=SMALL, period_s=1.0),
        Variant("souq, no cgroups", souq(cgroups="none"), SMALL, 1.0, memory=False),
        Variant("souq, default backoff", souq(0.1), 30, 1.0, warm=False, memory=False),
        # supervisord's loop waits for I/O for at most a second.
        Variant("supervisord", Supervisord, kills=SMALL, period_s=1.0),
        Variant(
            "supervisord, polled every 5 ms",
            Supervisord,
            kills=MIN_KILLS,
            period_s=1.0,
            warm=False,
            memory=False,
            poll=True,
        ),
        # circusd checks its processes every check_delay: 5 s unless its ini file says otherwise.
        Variant("circus", Circusd, kills=MIN_KILLS, period_s=5.0),
        Variant(
            "circus, check_delay 0.1",
            lambda root, marker: Circusd(root, marker, check_delay=0.1),
            kills=SMALL,
            period_s=0.1,
        ),
    ]


def _marker() -> str:
    """``sleep``'s argument for one daemon: unique, so only its own programs are counted."""
    return str(1_000_000_000 + random.randrange(10**8))


class Run:
    """The measurements of one variant; every phase makes its own daemon under ``root``."""

    def __init__(self, events: ProcEvents, variant: Variant, root: Path) -> None:
        self.events = events
        self.variant = variant
        self.root = root
        self.daemons = 0
        self.cold: dict[int, list[float]] = {}
        self.running: list[float] = []
        self.answered: list[float] = []
        self.out: dict[str, Any] = {}

    def launch(self, n: int) -> tuple[Daemon, str, dict[str, int]]:
        """A new daemon with ``n`` programs running (a cold start sample), and their pids."""
        self.daemons += 1
        marker = _marker()
        self.events.track(marker)
        daemon = self.variant.make(self.root / f"daemon{self.daemons}", marker)
        try:
            t0 = time.monotonic_ns()
            autostart = not isinstance(daemon, SouqAgent)
            daemon.launch(n, autostart=autostart)
            if not autostart:
                daemon.start_all()
            starts = self.events.wait_all(marker, n, t0, START_TIMEOUT_S)
        except BaseException:
            daemon.close()
            raise
        took = max(s.at_ns for s in starts.values()) - t0
        self.cold.setdefault(n, []).append(round(took / 1e6, 1))
        return daemon, marker, {k: s.pid for k, s in starts.items()}

    def warm_round(self, daemon: Daemon, marker: str, pids: dict[str, int]) -> dict[str, int]:
        """Stop the programs, then time the one request that starts them all again."""
        daemon.stop_all()
        self.events.wait_gone(list(pids.values()), 60)
        t0 = time.monotonic_ns()
        daemon.start_all()
        self.answered.append((time.monotonic_ns() - t0) / 1e9)
        starts = self.events.wait_all(marker, SMALL, t0, START_TIMEOUT_S)
        self.running.append((max(s.at_ns for s in starts.values()) - t0) / 1e9)
        return {k: s.pid for k, s in starts.items()}

    def restarts(self) -> None:
        daemon, marker, pids = self.launch(SMALL)
        poller = _Poller(daemon) if self.variant.poll else None
        latencies: list[float] = []
        in_waiter: list[float] = []  # Souq: the machine's exit until its souq-waiter's
        killed_at: dict[str, float] = {}  # Souq: wall-clock ms of each kill, for its events
        t_end = time.monotonic() + RESTART_BUDGET_S
        pauses = random.Random(self.variant.label)  # the same pauses in every run
        try:
            for key in sorted(pids)[: self.variant.kills]:
                if len(latencies) >= MIN_KILLS and time.monotonic() > t_end:
                    break
                pid = pids[key]
                parent = psutil.Process(pid).ppid()
                waiter = isinstance(daemon, SouqAgent) and parent != daemon.pid
                if waiter:
                    self.events.watch_exit(parent)
                killed_at[key] = time.time() * 1000
                t0 = time.monotonic_ns()
                os.kill(pid, signal.SIGKILL)
                start = self.events.wait_start(marker, key, t0, 60)
                latencies.append((start.at_ns - t0) / 1e9)
                died, parent_died = self.events.exit_ns(pid), self.events.exit_ns(parent)
                if waiter and died is not None and parent_died is not None:
                    in_waiter.append((parent_died - died) / 1e9)
                pids[key] = start.pid
                time.sleep(SETTLE_S + pauses.uniform(0, self.variant.period_s))
            if isinstance(daemon, SouqAgent):
                self.out["agent_records_p50_ms"] = _agent_records(daemon, killed_at)
        finally:
            if poller is not None:
                poller.stop()
            daemon.close()
        self.out["restart_ms"] = summary_ms(latencies)
        if in_waiter:
            waited = statistics.median(in_waiter)
            self.out["restart_split_p50_ms"] = {
                "machine_exit_to_waiter_exit": round(waited * 1e3, 3),
                "rest_of_restart": round((statistics.median(latencies) - waited) * 1e3, 3),
            }

    def memory(self, n: int) -> None:
        daemon, _, _ = self.launch(n)
        try:
            time.sleep(MEMORY_SETTLE_S)
            samples = []
            for _ in range(5):
                samples.append(daemon.memory())
                time.sleep(0.2)
            middle = sorted(samples, key=lambda m: m["rss_mb"])[len(samples) // 2]
            self.out.setdefault("memory_mb", {})[str(n)] = middle
            proc = psutil.Process(daemon.pid)
            before = sum(proc.cpu_times()[:2])
            time.sleep(CPU_WINDOW_S)
            used = sum(proc.cpu_times()[:2]) - before
            self.out.setdefault("idle_cpu_pct", {})[str(n)] = round(100 * used / CPU_WINDOW_S, 2)
        finally:
            daemon.close()

    def results(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cold_start_ms": {str(n): v for n, v in self.cold.items()}}
        if self.running:
            out["warm_start_100_ms"] = {
                "all_running": summary_ms(self.running),
                "answered": summary_ms(self.answered),
            }
        return {**out, **self.out}


def _agent_records(agent: SouqAgent, killed_at: dict[str, float]) -> dict[str, float]:
    """From each kill until the agent recorded the machine's exit, and its ``started`` again
    (its own events; their timestamps are wall-clock milliseconds, so to about 1 ms)."""
    exits: list[float] = []
    starts: list[float] = []
    for machine_id, at_ms in killed_at.items():
        after = [e for e in reversed(agent.events(machine_id)) if e.timestamp >= int(at_ms)]
        exit_ms = next((e.timestamp for e in after if e.type == "exit"), None)
        start_ms = next((e.timestamp for e in after if e.status.value == "started"), None)
        if exit_ms is not None and start_ms is not None:
            exits.append(exit_ms - at_ms)
            starts.append(start_ms - at_ms)
    if not starts:
        return {}
    return {
        "exit_recorded": round(statistics.median(exits), 1),
        "started_recorded": round(statistics.median(starts), 1),
        "n": len(starts),
    }


class _Poller:
    """A client asking supervisord for its state every ``POLL_S`` (as a status page, or
    ``supervisorctl status`` in a loop, would): each request wakes supervisord's loop."""

    def __init__(self, daemon: Daemon) -> None:
        assert isinstance(daemon, Supervisord)
        self._rpc: Any = xmlrpc.client.ServerProxy(daemon.url)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(POLL_S):
            self._rpc.supervisor.getState()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(5)


def _warm_phase(runs: list[Run]) -> None:
    """Every warm variant's daemon at once, idle; rounds interleaved, the order rotating."""
    live: list[tuple[Run, Daemon, str, dict[str, int]]] = []
    try:
        for run in runs:
            daemon, marker, pids = run.launch(SMALL)
            live.append((run, daemon, marker, pids))
            daemon.stop_all()
            run.events.wait_gone(list(pids.values()), 60)
        for r in range(ROUNDS):
            for i in range(len(live)):
                run, daemon, marker, pids = live[(i + r) % len(live)]
                pids = run.warm_round(daemon, marker, pids)
                daemon.stop_all()
                run.events.wait_gone(list(pids.values()), 60)
                live[(i + r) % len(live)] = (run, daemon, marker, pids)
            print(f"warm round {r + 1} of {ROUNDS} done", flush=True)
    finally:
        for _, daemon, _, _ in live:
            daemon.close()


def _ratios(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Souq's figure over each other supervisor's (below 1: Souq is faster or smaller)."""

    def get(label: str, *path: str) -> float | None:
        value: Any = results.get(label, {})
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, list):
            return float(statistics.median(value)) if value else None
        return float(value) if isinstance(value, int | float) else None

    measures = {
        "warm_start_100_p50": ("warm_start_100_ms", "all_running", "p50"),
        "cold_start_100_p50": ("cold_start_ms", str(SMALL)),
        "cold_start_1000": ("cold_start_ms", str(LARGE)),
        "restart_p50": ("restart_ms", "p50"),
        "restart_p99": ("restart_ms", "p99"),
        "rss_100": ("memory_mb", str(SMALL), "rss_mb"),
        "rss_1000": ("memory_mb", str(LARGE), "rss_mb"),
    }
    out: dict[str, Any] = {}
    for other in ("supervisord", "circus", "circus, check_delay 0.1"):
        row = {}
        for name, path in measures.items():
            a, b = get("souq", *path), get(other, *path)
            row[name] = round(a / b, 3) if a and b else None
        out[f"souq / {other}"] = row
    return out


def _versions() -> dict[str, str]:
    def run(*args: str) -> str:
        done = subprocess.run(list(args), capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    here = str(Path(souq.__file__).parent)  # the souq the agents import, wherever it is
    commit = run("git", "-C", here, "rev-parse", "--short", "HEAD") or "not a git checkout"
    dirty = " (uncommitted changes)" if run("git", "-C", here, "status", "--short") else ""
    return {
        "souq": commit + dirty,
        "supervisor": metadata.version("supervisor"),
        "circus": metadata.version("circus"),
        "nats-server": run(str(nats_server_binary()), "--version"),
        "python": sys.version.split()[0],
    }


def supervise() -> None:
    if os.geteuid() != 0:
        print("# supervise: skipped: the kernel's process connector needs root", flush=True)
        return
    print(f"# supervision benchmark — {machine_line()}", flush=True)
    versions = _versions()
    only = [label for label in os.environ.get("SUPERVISE_ONLY", "").split("|") if label]
    phases = os.environ.get("SUPERVISE_PHASES", "warm,restart,memory").split(",")
    partial = bool(only) or set(phases) != {"warm", "restart", "memory"}
    with (
        tempfile.TemporaryDirectory(prefix="souq-bench-") as tmp,
        ProcEvents() as events,
    ):
        root = Path(tmp)
        nats = NatsServer(store_dir=root / "nats")
        nats.start()
        try:
            variants = [v for v in _variants(nats.url) if not only or v.label in only]
            runs = [Run(events, v, root / f"v{i}") for i, v in enumerate(variants)]
            if "warm" in phases:
                _warm_phase([r for r in runs if r.variant.warm])
            for run in runs if "restart" in phases else []:
                run.restarts()
                print(run.variant.label, "restart", json.dumps(run.out["restart_ms"]), flush=True)
            for run in runs if "memory" in phases else []:
                if run.variant.memory:
                    run.memory(SMALL)
                    run.memory(LARGE)
                    print(run.variant.label, "memory", json.dumps(run.out["memory_mb"]), flush=True)
            nats_rss = rss_mb(nats.process.pid) if nats.process else None
        finally:
            nats.stop()
        dropped = events.dropped
    results = {run.variant.label: run.results() for run in runs}
    out = {
        "machine": machine_line(),
        "versions": versions,
        "nats_server_rss_mb": nats_rss,
        "events_dropped": dropped,
        "results": results,
        "ratios": _ratios(results),
    }
    print(json.dumps(out, indent=2))
    path = Path("bench/results")
    path.mkdir(parents=True, exist_ok=True)
    name = "supervise.partial.json" if partial else "supervise.json"
    (path / name).write_text(json.dumps(out, indent=2))


def main() -> None:
    supervise()
