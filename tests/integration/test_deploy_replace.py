"""A deploy whose update does not fit the machine's worker: a new machine elsewhere replaces it,
and the old one goes once the release is live (a real cluster, the CLI)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from souq.model.machine import MachineState
from souq.testing import Cluster, wait_until
from tests.integration.images_harness import souq

APP = "grow"


def toml(cpus: float) -> str:
    return f"""\
app = "{APP}"
primary_region = "mad"
[build]
dir = "."
[processes]
app = "sleep 600"
[http_service]
internal_port = 8080
[[vm]]
cpus = {cpus}
memory_mb = 64
[regions]
mad = 1
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("replace")
    with Cluster(root, regions={"mad": 2}, cpus=2, memory_mb=2048) as c:
        yield c


def test_an_update_that_does_not_fit_is_a_replacement(cluster: Cluster, tmp_path: Path) -> None:
    def deploy(cpus: float) -> None:
        (tmp_path / "souq.toml").write_text(toml(cpus))
        run = souq(cluster, "deploy", "--config", str(tmp_path / "souq.toml"), "--json")
        assert run.returncode == 0, run.stderr

    deploy(1.5)
    with cluster.client() as client:
        (old,) = client.list_machines(APP)
        # Its worker's last half cpu goes to another app.
        client.create_machine(
            "filler",
            "mad",
            {
                "cmd": ["sleep", "600"],
                "guest": {"cpus": 0.5},
                "constraints": [
                    {"attribute": "worker.id", "operator": "=", "value": old.worker_id}
                ],
            },
        )
    deploy(2.0)
    with cluster.client() as client:

        def replaced() -> bool:
            states = {m.id: m.state for m in client.list_machines(APP)}
            return states.get(old.id, MachineState.DESTROYED) is MachineState.DESTROYED

        wait_until(replaced, timeout=60, message="the old machine to be destroyed")
        (new,) = [m for m in client.list_machines(APP) if m.state is MachineState.STARTED]
        assert new.id != old.id and new.worker_id != old.worker_id
        assert new.config.guest.cpus == 2.0 and new.config.metadata["souq_release"] == "2"
        assert str(client.releases(APP)[0].state) == "complete"


def test_a_replacement_keeps_away_from_its_siblings_worker(
    cluster: Cluster, tmp_path: Path
) -> None:
    with cluster.client() as client:  # room: what the test before left goes
        for app in (APP, "filler"):
            for m in client.list_machines(app):
                if m.state is not MachineState.DESTROYED:
                    client.destroy(app, m.id, force=True)
    text = toml(0.5).replace("mad = 1", "mad = 2")

    def deploy(cpus: float) -> str:
        (tmp_path / "souq.toml").write_text(text.replace("cpus = 0.5", f"cpus = {cpus}"))
        run = souq(cluster, "deploy", "--config", str(tmp_path / "souq.toml"), "--json")
        assert run.returncode == 0, run.stderr
        return run.stdout

    deploy(0.5)
    with cluster.client() as client:
        live = [m for m in client.list_machines(APP) if m.state is MachineState.STARTED]
        assert len({m.worker_id for m in live}) == 2  # one on each worker
        first = live[0]
        client.create_machine(
            "filler",
            "mad",
            {
                "cmd": ["sleep", "600"],
                "guest": {"cpus": 1.25},
                "constraints": [
                    {"attribute": "worker.id", "operator": "=", "value": first.worker_id}
                ],
            },
        )
    # 1 cpu does not fit beside the filler: a replacement, away from its sibling's worker if
    # one had room. Two workers: none has, so it shares the sibling's, and the deploy says so.
    said = deploy(1.0)
    assert "mad cannot spread app: no other worker there has room" in said
