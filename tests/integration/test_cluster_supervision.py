"""Restart policies and stop escalation, counted on real processes."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from souq.model import MachineState
from souq.testing import Cluster, wait_until

PY = sys.executable


def app_name() -> str:
    return "s" + uuid.uuid4().hex[:10]


def counting_cmd(path: Path, exit_code: int) -> list[str]:
    return ["sh", "-c", f"echo run >> {path}; exit {exit_code}"]


def runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_on_failure_restarts_exactly_max_retries_times(cluster: Cluster, tmp_path: Path) -> None:
    client = cluster.client()
    app = app_name()
    count = tmp_path / "runs"
    m = client.create_machine(
        app,
        "mad",
        {"cmd": counting_cmd(count, 1), "restart": {"policy": "on-failure", "max_retries": 2}},
    )
    final = client.wait(app, m.id, "stopped", timeout=30)
    # Stopped for good only after the retries are spent: one run plus two restarts.
    assert runs(count) == 3
    assert final.restarts == 2
    exits = [e for e in client.events(app, m.id) if e.type == "exit"]
    assert len(exits) == 3
    assert all(e.exit_code == 1 for e in exits)
    client.destroy(app, m.id)


def test_on_failure_does_not_restart_a_clean_exit(cluster: Cluster, tmp_path: Path) -> None:
    client = cluster.client()
    app = app_name()
    count = tmp_path / "runs"
    m = client.create_machine(
        app, "mad", {"cmd": counting_cmd(count, 0), "restart": {"policy": "on-failure"}}
    )
    final = client.wait(app, m.id, "stopped", timeout=30)
    assert runs(count) == 1
    assert final.restarts == 0
    assert next(e for e in client.events(app, m.id) if e.type == "exit").exit_code == 0
    client.destroy(app, m.id)


def test_policy_no_never_restarts(cluster: Cluster, tmp_path: Path) -> None:
    client = cluster.client()
    app = app_name()
    count = tmp_path / "runs"
    m = client.create_machine(
        app, "mad", {"cmd": counting_cmd(count, 3), "restart": {"policy": "no"}}
    )
    final = client.wait(app, m.id, "stopped", timeout=30)
    assert runs(count) == 1
    assert final.restarts == 0
    assert next(e for e in client.events(app, m.id) if e.type == "exit").exit_code == 3
    client.destroy(app, m.id)


def test_always_restarts_even_clean_exits_until_stopped(cluster: Cluster, tmp_path: Path) -> None:
    client = cluster.client()
    app = app_name()
    count = tmp_path / "runs"
    m = client.create_machine(
        app, "mad", {"cmd": counting_cmd(count, 0), "restart": {"policy": "always"}}
    )
    wait_until(lambda: runs(count) >= 3, timeout=30, message="three runs")
    client.stop(app, m.id)
    final = client.wait(app, m.id, "stopped", timeout=30)
    assert final.restarts >= 2
    settled = runs(count)
    # A user stop is final: the machine stays stopped (state is the source of truth).
    assert client.get_machine(app, m.id).state == MachineState.STOPPED
    assert runs(count) == settled
    client.destroy(app, m.id)


def test_stop_escalates_to_sigkill_after_timeout(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    script = (
        "import signal,time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    m = client.create_machine(
        app,
        "mad",
        {"cmd": [PY, "-c", script], "stop_config": {"signal": "SIGTERM", "timeout_s": 0.5}},
    )
    wait_until(lambda: "ready" in client.logs(app, m.id), message="the handler to be installed")
    client.stop(app, m.id)
    client.wait(app, m.id, "stopped", timeout=15)
    exit_event = next(e for e in client.events(app, m.id) if e.type == "exit")
    assert exit_event.signal == "SIGKILL"
    client.destroy(app, m.id)


def test_graceful_stop_uses_the_configured_signal(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    script = (
        "import signal,sys,time\n"
        "def bye(*a):\n    print('bye', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGINT, bye)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    m = client.create_machine(app, "mad", {"cmd": [PY, "-c", script]})
    wait_until(lambda: "ready" in client.logs(app, m.id), message="the handler to be installed")
    client.stop(app, m.id)  # default stop signal: SIGINT
    client.wait(app, m.id, "stopped", timeout=15)
    assert "bye" in client.logs(app, m.id)
    exit_event = next(e for e in client.events(app, m.id) if e.type == "exit")
    assert exit_event.exit_code == 0
    client.destroy(app, m.id)
