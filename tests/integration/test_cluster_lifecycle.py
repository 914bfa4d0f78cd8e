"""The whole life cycle of a machine through the HTTP API, on real agents and processes."""

from __future__ import annotations

import os
import sys
import uuid

import httpx
import psutil
import pytest

from souq.errors import IllegalTransition, NotFound, WaitTimeout
from souq.model import MachineState
from souq.testing import Cluster, auth_headers, wait_until

PY = sys.executable


def app_name() -> str:
    return "t" + uuid.uuid4().hex[:10]


def test_machine_runs_on_a_worker_with_its_identity_in_env(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    m = client.create_machine(
        app,
        "mad",
        {
            "cmd": ["sh", "-c", "env | grep ^SOUQ_ | sort; echo HELLO=$HELLO; exec sleep 600"],
            "env": {"HELLO": "world"},
        },
    )
    assert m.state == MachineState.STARTED
    assert m.worker_id in {a.worker_id for a in cluster.agents}
    assert m.region == "mad"
    assert m.placement is not None and m.placement.winner == m.worker_id
    out = wait_until(
        lambda: (t := client.logs(app, m.id)) and "HELLO=world" in t and t,
        message="the machine's output",
    )
    assert f"SOUQ_MACHINE_ID={m.id}" in out
    assert f"SOUQ_APP={app}" in out
    assert "SOUQ_REGION=mad" in out
    assert f"SOUQ_WORKER_ID={m.worker_id}" in out
    assert m.pid is not None and psutil.pid_exists(m.pid)
    client.destroy(app, m.id, force=True)
    wait_until(
        lambda: not psutil.pid_exists(m.pid) or psutil.Process(m.pid).status() == "zombie",
        message="the process to be gone",
    )


def test_full_life_cycle(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    m = client.create_machine(app, "mad", {"cmd": ["sleep", "600"]}, name="web")
    assert m.name == "web"
    first_pid = m.pid

    assert [x.id for x in client.list_machines(app)] == [m.id]
    assert client.get_machine(app, m.id).state == MachineState.STARTED

    with pytest.raises(IllegalTransition):
        client.destroy(app, m.id)  # running: needs a stop first or force

    client.stop(app, m.id)
    stopped = client.wait(app, m.id, "stopped", timeout=10)
    assert stopped.state == MachineState.STOPPED
    assert first_pid is not None and not _alive(first_pid)

    started = client.start(app, m.id)
    assert started.state == MachineState.STARTED
    assert started.pid != first_pid

    restarted = client.restart(app, m.id)
    assert restarted.state == MachineState.STARTED
    assert restarted.pid not in (first_pid, started.pid)

    client.stop(app, m.id)
    client.wait(app, m.id, "stopped", timeout=10)
    gone = client.destroy(app, m.id)
    assert gone.state == MachineState.DESTROYED
    assert client.list_machines(app) == []

    with pytest.raises(IllegalTransition) as err:
        client.start(app, m.id)
    assert err.value.http_status == 409

    types = [e.type for e in client.events(app, m.id)]
    assert types[0] == "destroy"
    assert "launch" in types and "stop" in types and "start" in types


def test_signal_reaches_the_process(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    script = (
        "import signal,sys,time\n"
        "signal.signal(signal.SIGUSR1, lambda *a: print('got usr1', flush=True))\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(1)\n"
    )
    m = client.create_machine(app, "mad", {"cmd": [PY, "-c", script]})
    wait_until(lambda: "ready" in client.logs(app, m.id), message="ready")
    client.signal(app, m.id, "SIGUSR1")
    wait_until(lambda: "got usr1" in client.logs(app, m.id), message="the signal to arrive")
    client.destroy(app, m.id, force=True)


def test_unknown_machine_is_not_found(cluster: Cluster) -> None:
    client = cluster.client()
    with pytest.raises(NotFound) as err:
        client.get_machine(app_name(), "0123456789abcd")
    assert err.value.http_status == 404


def test_wait_times_out_with_408(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    m = client.create_machine(app, "mad", {"cmd": ["sleep", "600"]})
    with pytest.raises(WaitTimeout) as err:
        client.wait(app, m.id, "stopped", timeout=0.3)
    assert err.value.http_status == 408
    client.destroy(app, m.id, force=True)


def test_skip_launch_creates_without_starting(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    m = client.create_machine(app, "mad", {"cmd": ["sleep", "600"]}, skip_launch=True)
    assert m.state == MachineState.CREATED
    assert m.pid is None
    assert client.start(app, m.id).state == MachineState.STARTED
    client.destroy(app, m.id, force=True)


def test_logs_follow_streams_new_output(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    script = (
        "import time\nfor i in range(5):\n    print(f'line {i}', flush=True); time.sleep(0.2)\n"
    )
    m = client.create_machine(app, "mad", {"cmd": [PY, "-c", script], "restart": {"policy": "no"}})
    seen = ""
    for chunk in client.follow_logs(app, m.id):
        seen += chunk
        if "line 4" in seen:
            break
    assert [f"line {i}" for i in range(5)] == [ln for ln in seen.splitlines() if ln]
    client.wait(app, m.id, "stopped", timeout=10)
    client.destroy(app, m.id)


def test_workers_are_listed_with_capacity(cluster: Cluster) -> None:
    workers = cluster.client().workers()
    assert {w.id for w in workers} == {a.worker_id for a in cluster.agents}
    for w in workers:
        assert w.region == "mad"
        assert w.state.value == "up"
        assert w.capacity.cpus == 4
        assert w.capacity.memory_mb == 4096


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_machine_process_runs_in_its_own_session(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    m = client.create_machine(app, "mad", {"cmd": ["sleep", "600"]})
    assert m.pid is not None
    assert os.getsid(m.pid) == m.pid
    client.destroy(app, m.id, force=True)


def test_a_batch_starts_every_machine_with_its_own_process(cluster: Cluster) -> None:
    app = app_name()
    body = {
        "region": "mad",
        "count": 6,
        "config": {
            "cmd": ["sh", "-c", "echo up $SOUQ_MACHINE_ID; exec sleep 600"],
            "guest": {"cpus": 0.1, "memory_mb": 32},
        },
    }
    r = httpx.post(
        f"{cluster.api_url}/v1/apps/{app}/machines/batch",
        json=body,
        timeout=30,
        headers=auth_headers(),
    )
    assert r.status_code == 201, r.text
    machines = r.json()["machines"]
    assert len(machines) == 6 and {m["state"] for m in machines} == {"started"}
    pids = {m["pid"] for m in machines}
    assert len(pids) == 6 and all(psutil.pid_exists(p) for p in pids)
    client = cluster.client()
    for m in machines:
        wait_until(
            lambda m=m: f"up {m['id']}" in client.logs(app, m["id"]),
            message=f"the output of {m['id']}",
        )
        client.destroy(app, m["id"], force=True)
