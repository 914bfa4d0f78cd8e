"""A real ``souq agent`` killed with SIGKILL: its machines keep running, a new agent on the same
data dir re-adopts them, their exits are reported with the right status (souq-waiter), logs keep
flowing and every command still works. And the agent, a child subreaper, reaps the orphans its
machines leave behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from souq.drivers.waiter import waiter_path
from souq.errors import SouqError
from souq.model import Machine, MachineState
from souq.testing import AgentProcess, Cluster, wait_until
from tests.clusters import ClusterSpec
from tests.integration.agent_harness import pid_alive

S = MachineState
APP = "crash"

pytestmark = pytest.mark.skipif(waiter_path() is None, reason="no C compiler for souq-waiter")


def until_file(name: str, then: str) -> list[str]:
    """A machine that waits for ``name`` to appear in its directory, then runs ``then``."""
    return ["sh", "-c", f"while [ ! -e {name} ]; do sleep 0.01; done; {then}"]


CLUSTER = ClusterSpec("crash", regions={"mad": 1})


def machine_dir(agent: AgentProcess, machine_id: str) -> Path:
    return agent.data_dir / "machines" / machine_id


def test_machines_survive_a_kill_9_of_their_agent(cluster: Cluster) -> None:
    (agent,) = cluster.agents
    client = cluster.client()
    no_restart = {"policy": "no"}
    later = client.create_machine(
        APP, "mad", {"cmd": until_file("go", "exit 7"), "restart": no_restart}
    )
    meanwhile = client.create_machine(
        APP, "mad", {"cmd": until_file("go", "exit 5"), "restart": no_restart}
    )
    ticker = client.create_machine(
        APP,
        "mad",
        {"cmd": ["sh", "-c", "i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.02; done"]},
    )
    sleeper = client.create_machine(APP, "mad", {"cmd": ["sleep", "60"]})
    pids = {m.id: m.pid for m in (later, meanwhile, ticker, sleeper)}
    assert all(pids.values())

    agent.kill()
    assert all(pid_alive(pid or 0) for pid in pids.values())
    # One machine exits while no agent runs.
    (machine_dir(agent, meanwhile.id) / "go").touch()
    wait_until(lambda: not pid_alive(pids[meanwhile.id] or 0), message="an exit without agent")

    agent.start()
    cluster.wait_for_workers()
    machines = {m.id: m for m in client.list_machines(APP)}
    for mid in (later.id, ticker.id, sleeper.id):  # re-adopted, same process
        assert (machines[mid].state, machines[mid].pid) == (S.STARTED, pids[mid])
    # The exit that happened meanwhile is reported with its code.
    dead = client.wait(APP, meanwhile.id, S.STOPPED, timeout=10)
    assert (dead.exit_code, dead.events[0].type) == (5, "exit")
    # So is the exit of an adopted process.
    (machine_dir(agent, later.id) / "go").touch()
    done = client.wait(APP, later.id, S.STOPPED, timeout=10)
    assert done.exit_code == 7
    assert done.events[0].message == "exited with code 7; restart policy is no"
    # Logs keep flowing.
    before = client.logs(APP, ticker.id).count("tick")
    wait_until(lambda: client.logs(APP, ticker.id).count("tick") > before + 3, message="more ticks")
    # Signal, stop and destroy work on adopted machines.
    client.signal(APP, sleeper.id, "SIGTERM")

    def restarted() -> Machine | None:
        m = client.get_machine(APP, sleeper.id)
        return m if m.state is S.STARTED and m.pid != pids[sleeper.id] else None

    killed = wait_until(restarted, message="the restart after SIGTERM")  # on-failure
    exit_event = next(e for e in killed.events if e.type == "exit")
    assert exit_event.signal == "SIGTERM"
    client.stop(APP, ticker.id)
    stopped = client.wait(APP, ticker.id, S.STOPPED, timeout=10)
    assert stopped.events[0].signal == "SIGINT"
    assert not pid_alive(pids[ticker.id] or 0)
    for m in (later, meanwhile, ticker, sleeper):
        assert client.destroy(APP, m.id, force=True).state is S.DESTROYED
    assert not any(pid_alive(pid or 0) for pid in pids.values())


def test_the_agent_reaps_orphans_of_its_machines(cluster: Cluster) -> None:
    (agent,) = cluster.agents
    client = cluster.client()
    # The inner shell starts a background job and exits: the job is orphaned, and re-parented
    # to the nearest subreaper: the agent.
    orphan = "while [ ! -e release ]; do sleep 0.01; done"
    cmd = ["sh", "-c", f"sh -c '({orphan}) & echo $! > orphan'; sleep 60"]
    m = client.create_machine(APP, "mad", {"cmd": cmd})
    pidfile = machine_dir(agent, m.id) / "orphan"
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), message="the orphan")
    pid = int(pidfile.read_text())
    wait_until(
        lambda: psutil.Process(pid).ppid() == agent.pid, message="the orphan to be the agent's"
    )
    (machine_dir(agent, m.id) / "release").touch()
    # Reaped at once: it never stays a zombie.
    wait_until(lambda: not psutil.pid_exists(pid), timeout=5, message="the orphan to be reaped")
    zombies = [
        p.pid for p in psutil.Process(agent.pid).children() if p.status() == psutil.STATUS_ZOMBIE
    ]
    assert zombies == []
    assert client.get_machine(APP, m.id).state is S.STARTED  # the machine itself is untouched
    client.destroy(APP, m.id, force=True)


def test_the_op_log_is_readable_over_http_and_the_cli(cluster: Cluster) -> None:
    client = cluster.client()
    m = client.create_machine(APP, "mad", {"cmd": ["sleep", "60"]})
    client.stop(APP, m.id)
    client.wait(APP, m.id, S.STOPPED, timeout=10)
    steps = client.ops(APP, m.id)
    assert [(s.kind, s.state, s.event) for s in steps] == [
        ("create", "spawning", "begin"),
        ("create", "done", "spawned"),
        ("stop", "signalling", "begin"),
        ("stop", "done", "exited"),
    ]
    assert steps[2].detail["signal"] == "SIGINT"
    assert steps[0].timestamp <= steps[-1].timestamp
    env = {**os.environ, "SOUQ_API": cluster.api_url}
    souq = [sys.executable, "-m", "souq", "machine", "ops", m.id, "--app", APP]
    shown = subprocess.run([*souq, "--json"], env=env, capture_output=True, text=True, check=True)
    assert [s["kind"] for s in json.loads(shown.stdout)] == ["create", "create", "stop", "stop"]
    table = subprocess.run(souq, env=env, capture_output=True, text=True, check=True).stdout
    assert "signalling" in table and "spawned" in table
    missing = subprocess.run(
        [*souq[:5], "nope", "--app", APP], env=env, capture_output=True, text=True, check=False
    )
    assert missing.returncode != 0 and "not found" in missing.stderr
    client.destroy(APP, m.id)


def test_drain_cordons_and_stops_every_machine_with_its_stop_config(cluster: Cluster) -> None:
    (agent,) = cluster.agents
    client = cluster.client()
    term = client.create_machine(
        APP, "mad", {"cmd": ["sleep", "60"], "stop_config": {"signal": "SIGTERM"}}
    )
    default = client.create_machine(APP, "mad", {"cmd": ["sleep", "60"]})
    env = {**os.environ, "SOUQ_API": cluster.api_url}
    assert agent.worker_id is not None
    shown = subprocess.run(
        [sys.executable, "-m", "souq", "workers", "drain", agent.worker_id, "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    (info,) = json.loads(shown.stdout)
    assert info["state"] == "draining"  # the stops are sent; the exits are still to come
    stopped = client.wait(APP, term.id, S.STOPPED, timeout=10)
    assert stopped.events[0].signal == "SIGTERM"
    stopped = client.wait(APP, default.id, S.STOPPED, timeout=10)
    assert stopped.events[0].signal == "SIGINT"
    wait_until(
        lambda: {w.state.value for w in client.workers()} == {"cordoned"},
        message="the drained worker to be cordoned",
    )
    with pytest.raises(SouqError) as refused:
        client.create_machine(APP, "mad", {"cmd": ["sleep", "60"]})
    assert refused.value.status == "insufficient_capacity"
    assert client.uncordon(agent.worker_id).state.value == "up"
    again = client.create_machine(APP, "mad", {"cmd": ["sleep", "60"]})
    for m in (term, default, again):
        client.destroy(APP, m.id, force=True)
