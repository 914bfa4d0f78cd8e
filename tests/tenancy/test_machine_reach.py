"""From inside a machine of one app, nothing of another app's machines (environment, memory,
files, signals) and nothing of the worker's (agent state, logs, the auth directory, NATS
credentials) is reachable, under every driver the worker offers. Real root agent with its own
defaults (a uid per machine, the sandbox), real machines probing from inside."""

from __future__ import annotations

import os

import pytest

from souq.drivers import sandbox
from souq.testing import Cluster, wait_until
from tests.clusters import isolated
from tests.isolated import destroy, output, processes_of, started

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a uid per machine needs a root agent"),
    pytest.mark.skipif(not sandbox.available(), reason=f"{sandbox.unavailable()}"),
]


CLUSTER = isolated("reach")


def test_from_inside_a_machine_nothing_of_another_machine_or_the_worker_is_reachable(
    cluster: Cluster,
) -> None:
    """Under every driver the worker offers: a plain process (exec) and the sandbox, each of
    a uid of its own."""
    data = cluster.agents[0].data_dir
    victim = started(
        cluster,
        {"driver": "exec", "cmd": ["sleep", "600"], "env": {"BRAVO_SECRET": "s3cr3t"}},
        app="bravo",
    )
    try:
        (pid,) = wait_until(lambda: processes_of(victim.id), timeout=10, message="bravo's pid")
        probes = {
            "environ": f"cat /proc/{pid}/environ",
            "memory": f"cat /proc/{pid}/mem",
            "signal": f"kill -0 {pid}",
            "cwd": f"ls /proc/{pid}/cwd/",
            "state": f"ls {data}/",
            "machines": f"ls {data}/machines/{victim.id}/",
            "records": f"ls {data}/machines/.agent/",
            "auth": f"ls {cluster.root / 'auth'}/",
            "nats-credentials": f"cat {cluster.root / 'auth' / 'nats' / 'broker.nk'}",
            "admin-token": f"cat {cluster.root / 'auth' / 'admin.token'}",
            "agent-log": f"cat {cluster.agents[0].log_path}",
            "victim-output": f"cat {data}/machines/.agent/{victim.id}/output.log",
        }
        for path in (cluster.root / "auth" / "nats" / "broker.nk", cluster.agents[0].log_path):
            assert path.exists(), path  # the probes below are real
        script = "; ".join(
            f"if {probe} >/dev/null 2>&1; then echo {name}=OPEN; else echo {name}=closed; fi"
            for name, probe in probes.items()
        )
        for driver in ("exec", "sandbox"):
            spy = started(
                cluster, {"driver": driver, "cmd": ["sh", "-c", f"{script}; echo done; sleep 600"]}
            )
            try:
                text = output(cluster, spy, "done")
                assert "OPEN" not in text, (driver, text)
                assert "s3cr3t" not in text
            finally:
                destroy(cluster, spy)
    finally:
        destroy(cluster, victim, app="bravo")
