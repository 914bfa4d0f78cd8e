"""``souq simulate --from-cluster`` on a real cluster (nats-server, two agents, a broker, auth
on): the snapshot sees what the machines hold, the planned batch is placed in order on virtual
time, the machine that does not fit is named with its reason, and nothing is created."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

from souq.client.api import SouqClient
from souq.model import Resources
from souq.testing import Cluster, wait_until

SLEEP = {"cmd": ["sleep", "600"]}


def simulate(cluster: Cluster, *args: str) -> tuple[int, dict[str, Any]]:
    """``souq simulate ARGS --json`` against the cluster: its exit status and its JSON."""
    done = subprocess.run(
        [sys.executable, "-m", "souq", "simulate", *args, "--json"],
        env={**os.environ, "SOUQ_API": cluster.api_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def allocations(client: SouqClient) -> dict[str, Resources]:
    return {w.id: w.allocated for w in client.workers()}


def test_a_planned_batch_on_a_snapshot_of_the_cluster(cluster: Cluster) -> None:
    client = cluster.client()
    app = "whatif" + uuid.uuid4().hex[:8]
    full = client.create_machine(app, "mad", {**SLEEP, "guest": {"cpus": 4, "memory_mb": 256}})
    (other,) = {a.worker_id for a in cluster.agents} - {full.worker_id}
    small = client.create_machine(
        app,
        "mad",
        {**SLEEP, "guest": {"cpus": 1, "memory_mb": 256}},
    )
    assert small.worker_id == other

    def settled() -> bool:
        held = allocations(client)
        return held[full.worker_id].cpus == 4 and held[other].cpus == 1

    wait_until(settled, timeout=15, message="the workers to report both machines")
    before = allocations(client)
    machines = sorted(m.id for m in client.list_machines(app))

    # 3 cpus are left, all on one worker: three machines of 1 cpu fit, the fourth does not.
    size = ["--from-cluster", "--region", "mad", "--cpus", "1", "--memory-mb", "256"]
    status, body = simulate(cluster, *size, "--count", "4", "--app", app)
    assert status == 3
    assert body["snapshot"] == {"workers": 2, "skipped": []}
    assert (body["placed"], body["unplaced"], body["reasons"]) == (3, 1, {"insufficient_cpu": 1})
    planned = body["machines"]
    assert [m["index"] for m in planned] == [1, 2, 3, 4]
    assert [m["worker"] for m in planned] == [other, other, other, None]
    for m in planned[:3]:  # each with the record a dry run gives
        record = m["placement"]
        assert record["winner"] == other and record["rejections"] == {"insufficient_cpu": 1}
        rejected = {o["worker_id"]: o["rejected"] for o in record["offers"] if o["rejected"]}
        assert rejected == {full.worker_id: "insufficient_cpu"}  # the full worker: nothing
    last = planned[3]
    assert last["reason"] == "insufficient_cpu"
    assert "no worker in region mad can take 1 cpus" in last["error"]
    assert last["placement"]["rejections"] == {"insufficient_cpu": 2}
    assert last["placement"]["winner"] is None

    # What fits exits 0; and nothing was made either time.
    status, body = simulate(cluster, *size, "--count", "3", "--app", app)
    assert (status, body["placed"], body["unplaced"]) == (0, 3, 0)
    assert sorted(m.id for m in client.list_machines(app)) == machines
    assert allocations(client) == before

    for m in (full, small):
        client.destroy(app, m.id, force=True)
