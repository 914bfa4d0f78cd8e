"""A deploy's served machine displaced by a create of a higher priority class is re-placed by
``souq scale reconcile``: a new machine on another worker, the displaced one destroyed, and the
deploy's record says why (a real cluster, the CLI)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from souq.model.machine import MachineState
from souq.testing import Cluster, wait_until
from tests.integration.images_harness import souq

APP = "served"
TOML = f"""\
app = "{APP}"
primary_region = "mad"
[build]
dir = "."
[processes]
app = "sleep 600"
[http_service]
internal_port = 8080
[[vm]]
cpus = 1
memory_mb = 64
[regions]
mad = 1
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("preempted")
    with Cluster(root, regions={"mad": 2}, cpus=1, memory_mb=1024) as c:
        yield c


def test_a_preempted_served_machine_is_replaced_elsewhere(cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "souq.toml").write_text(TOML)
    run = souq(cluster, "deploy", "--config", str(tmp_path / "souq.toml"), "--json")
    assert run.returncode == 0, run.stderr
    with cluster.client() as client:
        (old,) = client.list_machines(APP)
        # A reserved machine that must run on the served machine's worker displaces it.
        taker = client.create_machine(
            "prod",
            "mad",
            {
                "cmd": ["sleep", "600"],
                "guest": {"cpus": 1, "memory_mb": 64},
                "priority_class": "reserved",
                "constraints": [
                    {"attribute": "worker.id", "operator": "=", "value": old.worker_id}
                ],
            },
        )
        assert taker.placement is not None
        assert [v.machine_id for v in taker.placement.preempted] == [old.id]
        client.wait(APP, old.id, "stopped", timeout=30)

        # Nothing displaced yet at rest: reconcile finds the displaced machine and re-places it.
        run = souq(cluster, "scale", "reconcile", "--app", APP, "--json")
        assert run.returncode == 0, run.stderr
        events = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
        said = " / ".join(e["message"] for e in events)
        assert f"in the place of machine {old.id}, preempted" in said
        assert f"machine {old.id} destroyed (replaced: preempted by machine {taker.id}" in said

        def replaced() -> bool:
            states = {m.id: m.state for m in client.list_machines(APP)}
            return states.get(old.id, MachineState.DESTROYED) is MachineState.DESTROYED

        wait_until(replaced, timeout=60, message="the displaced machine to be destroyed")
        (new,) = [m for m in client.list_machines(APP) if m.state is MachineState.STARTED]
        assert new.id != old.id and new.worker_id != old.worker_id
        assert new.config.metadata["souq_process_group"] == "app"
        (release, *_) = client.releases(APP)
        assert str(release.state) == "complete" and "reconcile" in release.description
        # At its counts again: a second reconcile changes nothing.
        again = souq(cluster, "scale", "reconcile", "--app", APP, "--json")
        assert again.returncode == 0, again.stderr
        assert "nothing changed" in again.stdout
