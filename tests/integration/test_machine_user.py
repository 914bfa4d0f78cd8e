"""Machines run as an unprivileged user and inherit nothing of the agent's environment: a real
``souq agent`` run as root (its default: a uid of each machine's own, souq.drivers.identity),
real processes through souq-waiter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from souq.drivers.identity import BASE, COUNT
from souq.drivers.waiter import waiter_path
from souq.model import MachineState
from souq.testing import AgentProcess, Cluster, environment, wait_until
from tests.clusters import ClusterSpec, agent

S = MachineState
APP = "users"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs an agent run as root"),
    pytest.mark.skipif(waiter_path() is None, reason="no C compiler for souq-waiter"),
]


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    """A directory every user may enter (pytest's own is root's alone, which would make the
    probes below pass for the wrong reason)."""
    path = Path(tempfile.mkdtemp(prefix="souq-users-"))
    path.chmod(0o755)
    yield path
    if not os.environ.get("KEEP"):
        shutil.rmtree(path, ignore_errors=True)


def _secured(cluster: Cluster) -> None:
    assert os.environ["SOUQ_AUTH_DIR"] and os.environ["SOUQ_TOKEN"]


# A secured cluster (its agents see ``SOUQ_AUTH_DIR`` and ``SOUQ_TOKEN``) whose agent also has a
# marker variable in its environment, and the agent's own default machine user.
CLUSTER = ClusterSpec(
    "users",
    regions={"mad": 0},
    root_fixture="root",
    subdir="cluster",
    env={"SOUQ_LEAK_MARKER": "agent-only-7f3a"},
    agents=(agent("mad", machine_user=None),),
    ready=_secured,
)


def logs_of(cluster: Cluster, machine_id: str, *, until: str) -> str:
    client = cluster.client()
    return wait_until(
        lambda: (text := client.logs(APP, machine_id)) and until in text and text,
        message=f"{until!r} in the machine's log",
    )


def run_once(cluster: Cluster, script: str) -> str:
    client = cluster.client()
    m = client.create_machine(
        APP, "mad", {"cmd": ["sh", "-c", script + "; echo END"], "restart": {"policy": "no"}}
    )
    try:
        return logs_of(cluster, m.id, until="END")
    finally:
        client.destroy(APP, m.id, force=True)


def own_uid(text: str) -> int:
    """A uid of the machines' range, or a failed assertion."""
    uid = int(text)
    assert BASE <= uid < BASE + COUNT, uid
    return uid


def test_machines_run_as_a_uid_of_their_own_by_default(cluster: Cluster) -> None:
    first = run_once(cluster, "id -u; id -g; id -G").split()[:3]
    second = run_once(cluster, "id -u").split()[0]
    uid = own_uid(first[0])
    assert first == [str(uid)] * 3  # its own group too, and no other
    assert own_uid(second) != uid  # each machine its own
    (worker,) = cluster.client().workers()
    assert worker.fingerprint is not None
    assert worker.fingerprint.machine_user.startswith("a uid of each machine's own")


def test_a_machine_cannot_touch_the_agents_data(cluster: Cluster) -> None:
    (agent,) = cluster.agents
    data = agent.data_dir
    assert (data / "state.db").stat().st_mode & 0o077 == 0
    script = (
        f"ls {data}; "  # it may pass through the directory, not list it
        f"touch {data}/planted 2>/dev/null && echo WROTE-DATA; "
        f"cat {data}/state.db >/dev/null 2>&1 && echo READ-STATE; "
        f"touch {data}/machines/planted 2>/dev/null && echo WROTE-MACHINES; "
        f"ls {data}/machines/.agent >/dev/null 2>&1; "
        f"touch {data}/machines/.agent/planted 2>/dev/null && echo WROTE-RECORDS; "
        f"cat {data}/machines/.agent/*/output.log 2>/dev/null | grep -q . && echo READ-LOGS; "
        "touch ./mine && echo WROTE-OWN; echo HOME=$HOME; pwd"
    )
    out = run_once(cluster, script)
    assert "state.db" not in out and "Permission denied" in out
    for forbidden in ("WROTE-DATA", "READ-STATE", "WROTE-MACHINES", "WROTE-RECORDS", "READ-LOGS"):
        assert forbidden not in out
    assert "WROTE-OWN" in out
    lines = out.splitlines()
    home = next(line for line in lines if line.startswith("HOME="))[5:]
    assert home == lines[lines.index("WROTE-OWN") + 2]  # HOME is its own directory
    assert home.startswith(str(data / "machines"))
    assert not (data / "planted").exists()


def test_a_machine_inherits_nothing_of_the_agents_environment(cluster: Cluster) -> None:
    out = run_once(cluster, "env")
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert "SOUQ_LEAK_MARKER" not in env
    assert "SOUQ_TOKEN" not in env
    assert "SOUQ_AUTH_DIR" not in env
    assert cluster.auth is not None
    assert "agent-only-7f3a" not in out and cluster.auth.admin() not in out
    assert env["HOME"] != "/root" and env["HOME"].endswith(env["SOUQ_MACHINE_ID"])
    assert set(env) <= {"PATH", "LANG", "HOME", "PWD", "SHLVL", "_", "OLDPWD"} | {
        k for k in env if k.startswith("SOUQ_") and k != "SOUQ_LEAK_MARKER"
    }


def test_machines_run_as_their_uid_after_a_crash_and_a_restart(cluster: Cluster) -> None:
    (agent,) = cluster.agents
    client = cluster.client()
    waits = client.create_machine(
        APP,
        "mad",
        {
            "cmd": ["sh", "-c", "id -u; while [ ! -e go ]; do sleep 0.01; done; exit 7"],
            "restart": {"policy": "no"},
        },
    )
    crashes = client.create_machine(
        APP, "mad", {"cmd": ["sh", "-c", "echo RUN $(id -u); sleep 0.2; exit 1"]}
    )
    agent.kill()
    agent.start()
    cluster.wait_for_workers()
    (agent.data_dir / "machines" / waits.id / "go").touch()
    done = client.wait(APP, waits.id, S.STOPPED, timeout=20)
    assert done.events[0].exit_code == 7  # its waiter's exit file, read by the new agent

    # The restart policy restarts it (as its own uid, the same) under the new agent too.
    def restarted() -> bool:
        runs = [line.split()[1] for line in client.logs(APP, crashes.id).splitlines()]
        return len(runs) >= 3 and len(set(runs)) == 1 and own_uid(runs[0]) > 0

    wait_until(restarted, timeout=20, message="the crashing machine restarted as its uid")
    for m in (waits, crashes):
        client.destroy(APP, m.id, force=True)


def test_root_machines_must_be_asked_for_twice(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "souq", "agent", "--region", "mad"]
    args += ["--nats", "nats://127.0.0.1:1", "--data-dir", str(tmp_path / "a")]
    refused = subprocess.run(
        [*args, "--machine-user", "root"], check=False, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0
    assert "machines would run as root" in refused.stderr
    assert "--allow-root-machines" in refused.stderr
    unknown = subprocess.run(
        [*args, "--machine-user", "no-such-user-x"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unknown.returncode != 0 and "no such user" in unknown.stderr


def test_root_machines_when_asked_for_twice(cluster: Cluster) -> None:
    agent = AgentProcess(
        region="mad",
        nats_url=cluster.nats.url,
        data_dir=cluster.root / "workers" / "rooted",
        machine_user="root",
    )
    agent.start()
    try:
        assert "machines run as root" in agent.log_tail()
    finally:
        agent.stop()


def test_machines_run_as_their_uid_without_souq_waiter(cluster: Cluster) -> None:
    """Popen switches the user; the agent moves the process into its cgroup."""
    with environment(SOUQ_WAITER="off"):
        agent = AgentProcess(
            region="syd",
            nats_url=cluster.nats.url,
            data_dir=cluster.root / "workers" / "syd-direct",
            machine_user=None,
        )
        agent.start()
    cluster.agents.append(agent)
    try:
        cluster.wait_for_workers()
        client = cluster.client()
        m = client.create_machine(
            APP,
            "syd",
            {
                "cmd": ["sh", "-c", "id -u; id -G; cat /proc/self/cgroup; echo END"],
                "restart": {"policy": "no"},
            },
        )
        out = logs_of(cluster, m.id, until="END")
        uid = own_uid(out.split()[0])
        assert out.split()[1] == str(uid)
        worker = next(w for w in client.workers() if w.id == agent.worker_id)
        assert worker.fingerprint is not None
        if worker.fingerprint.isolation.get("cgroups") != "none":
            assert f"souq/{m.id}" in out  # in its cgroup, though it could not join it itself
        client.destroy(APP, m.id, force=True)
    finally:
        cluster.agents.remove(agent)
        agent.stop()
