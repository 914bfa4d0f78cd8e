"""A command that cannot run is a failure a user sees: ``souq machine run`` against a real
cluster says why and exits 1, and the failed machine gives its capacity back (on its worker and
in the broker's book), takes it again at a start, and is refused cleanly when the room is gone."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from souq.errors import InsufficientCapacity
from souq.model import MachineState
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec
from tests.integration.images_harness import SOUQ

S = MachineState
APP = "broken"
CPUS = 2  # the one worker's


CLUSTER = ClusterSpec("runfail", regions={"mad": 1}, cpus=CPUS)


def souq(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SOUQ_API": cluster.api_url}
    return subprocess.run(
        [SOUQ, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def allocated_cpus(cluster: Cluster) -> float:
    (worker,) = cluster.client().workers()
    return worker.allocated.cpus


def test_a_command_that_cannot_run_fails_the_run_and_holds_no_capacity(cluster: Cluster) -> None:
    client = cluster.client()
    run = ("machine", "run", "--app", APP, "--region", "mad", "--cpus", str(CPUS))
    failed = souq(cluster, *run, "--", "nosuchcmd")
    assert failed.returncode == 1, failed
    assert failed.stdout == ""  # no id to mistake for a running machine
    assert "could not be started" in failed.stderr
    assert "cannot run 'nosuchcmd'" in failed.stderr, failed.stderr
    (machine,) = client.list_machines(APP)
    assert machine.state is S.FAILED
    assert machine.id in failed.stderr
    # Its reservation is given back, on the worker and in the broker's book: the whole worker
    # is free for the next machine.
    wait_until(lambda: allocated_cpus(cluster) == 0, message="the failed machine's cpus freed")
    # So it stays through a crash of the agent: the store holds no reservation for it.
    (agent,) = cluster.agents
    agent.kill()
    agent.start()
    cluster.wait_for_workers()
    wait_until(lambda: allocated_cpus(cluster) == 0, message="still free after a restart")
    ok = souq(cluster, *run, "--json", "--", "sleep", "600")
    assert ok.returncode == 0, ok
    sleeper = json.loads(ok.stdout)["id"]
    assert client.get_machine(APP, sleeper).state is S.STARTED
    # A start of the failed machine takes its capacity again: refused cleanly while the room is
    # gone (nothing changes), taken when it is back (and given back as it fails again).
    with pytest.raises(InsufficientCapacity, match="cannot start again") as refused:
        client.start(APP, machine.id)
    assert refused.value.details["reason"] == "insufficient_cpu"
    assert client.get_machine(APP, machine.id).state is S.FAILED
    start = souq(cluster, "machine", "start", machine.id, "--app", APP)
    assert start.returncode == 3, start
    assert "insufficient_capacity" in start.stderr or "cannot start again" in start.stderr
    client.destroy(APP, sleeper, force=True)
    wait_until(lambda: allocated_cpus(cluster) == 0, message="the sleeper's cpus freed")
    client.start(APP, machine.id)
    again = wait_until(
        lambda: (
            (m := client.get_machine(APP, machine.id)).state is S.FAILED
            and sum(e.type == "fail" for e in m.events) == 2
            and m
        ),
        message="the second start to fail too",
    )
    assert again.events[0].message and "nosuchcmd" in again.events[0].message
    wait_until(lambda: allocated_cpus(cluster) == 0, message="given back again")
    # A program that starts and ends at once is a success: it ran.
    done = souq(cluster, "machine", "run", "--app", APP, "--region", "mad", "--", "true")
    assert done.returncode == 0, done
    assert done.stdout.strip()
    assert client.destroy(APP, machine.id).state is S.DESTROYED
    # What is left is the stopped machine's one cpu (a stopped machine keeps its reservation):
    # the failed one's destroy gave back nothing it did not hold.
    wait_until(lambda: allocated_cpus(cluster) == 1, message="the stopped machine's cpu alone")
