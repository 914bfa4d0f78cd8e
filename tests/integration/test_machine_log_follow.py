"""`souq machine logs ID --follow` as a user runs it (the CLI as a process, with a deadline) on
a real cluster: following ends, exit 0, once the machine is down with no restart coming and
its output is drained (as `docker logs -f` does), and goes on through a restart's backoff."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from souq.model import MachineState
from souq.testing import Cluster
from tests.clusters import ClusterSpec
from tests.integration.images_harness import SOUQ

APP = "follow"


CLUSTER = ClusterSpec("logfollow", regions={"mad": 1})


def follow(cluster: Cluster, machine_id: str) -> subprocess.CompletedProcess[str]:
    """The CLI following the machine's output; a follow that does not end is killed at 60 s."""
    env = {**os.environ, "SOUQ_API": cluster.api_url}
    return subprocess.run(
        [SOUQ, "machine", "logs", machine_id, "--app", APP, "--follow"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def run(cluster: Cluster, script: str, restart: dict[str, object]) -> str:
    with cluster.client() as client:
        machine = client.create_machine(
            APP,
            "mad",
            {"cmd": ["sh", "-c", script], "guest": {"cpus": 0.1}, "restart": restart},
        )
        return machine.id


def test_following_ends_once_the_machine_exits_with_restart_no(
    cluster: Cluster, tmp_path: Path
) -> None:
    machine_id = run(cluster, "echo one; sleep 1; echo two", {"policy": "no"})
    done = follow(cluster, machine_id)  # started while the machine runs
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["one", "two"]
    with cluster.client() as client:
        assert client.get_machine(APP, machine_id).state is MachineState.STOPPED
    # Following a machine already down prints what it wrote and ends at once.
    again = follow(cluster, machine_id)
    assert again.returncode == 0 and again.stdout.split() == ["one", "two"]


def test_following_goes_on_through_a_restart_and_ends_when_none_is_coming(
    cluster: Cluster,
) -> None:
    # Fails twice: the first exit's restart waits out its backoff (the stream goes on), the
    # second has none left (it ends).
    machine_id = run(
        cluster, "echo attempt; sleep 0.5; exit 1", {"policy": "on-failure", "max_retries": 1}
    )
    done = follow(cluster, machine_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["attempt", "attempt"]
