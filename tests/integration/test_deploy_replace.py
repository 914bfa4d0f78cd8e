"""A deploy whose update does not fit the machine's worker: a new machine elsewhere replaces it,
and the old one goes once the release is live; one for which neither the growth nor a
replacement has room fails before it changed anything (a real cluster, the CLI)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from souq.model.machine import MachineState
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec
from tests.integration.images_harness import souq

APP = "grow"
IMMEDIATE = '[deploy]\nstrategy = "immediate"\n'


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


CLUSTER = ClusterSpec("replace", regions={"mad": 2}, cpus=2, memory_mb=2048)


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
    # there were another. Two workers, each running one of the app's machines (the one replaced
    # runs until its replacement is healthy): it shares the sibling's, and the deploy says why.
    said = deploy(1.0)
    spread = "mad cannot spread app: every worker there (2) already runs one of its machines"
    assert said.count(spread) == 1


def clear(cluster: Cluster) -> None:
    """Every machine the tests before left goes (those on their way out, once gone)."""
    going = (MachineState.DESTROYING, MachineState.DESTROYED)
    with cluster.client() as client:
        for app in (APP, "filler"):
            for m in client.list_machines(app):
                if m.state not in going:
                    client.destroy(app, m.id, force=True)

        def gone() -> bool:
            states = [m.state for a in (APP, "filler") for m in client.list_machines(a)]
            return all(s is MachineState.DESTROYED for s in states)

        wait_until(gone, timeout=60, message="the machines of the tests before to go")


def fill(cluster: Cluster, worker_id: str, cpus: float) -> None:
    """Another app's machine takes ``cpus`` of the worker."""
    on = {"attribute": "worker.id", "operator": "=", "value": worker_id}
    with cluster.client() as client:
        client.create_machine(
            "filler", "mad", {"cmd": ["sleep", "600"], "guest": {"cpus": cpus}, "constraints": [on]}
        )


def test_a_deploy_without_all_the_room_it_needs_changes_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    clear(cluster)
    text = toml(0.5).replace("mad = 1", "mad = 2").replace("[regions]", IMMEDIATE + "[regions]")

    def deploy(cpus: float) -> subprocess.CompletedProcess[str]:
        (tmp_path / "souq.toml").write_text(text.replace("cpus = 0.5", f"cpus = {cpus}"))
        return souq(cluster, "deploy", "--config", str(tmp_path / "souq.toml"), "--json")

    assert deploy(0.5).returncode == 0
    with cluster.client() as client:
        before = {m.id: m for m in client.list_machines(APP) if m.state is MachineState.STARTED}
    a, b = sorted(before.values(), key=lambda m: m.id)
    assert a.worker_id != b.worker_id  # one on each worker (2 cpus each)
    fill(cluster, a.worker_id, 1.0)  # a can grow to 0.9 there (0.5 free)
    fill(cluster, b.worker_id, 1.4)  # b cannot (0.1 free), and no worker has 0.9 for a new one
    run = deploy(0.9)
    assert run.returncode == 3, run.stderr
    assert f"machine {b.id} cannot grow on its worker" in run.stderr
    assert "nothing was changed" in run.stderr
    with cluster.client() as client:
        after = {m.id: m for m in client.list_machines(APP)}
        # Neither machine was touched: same process (instance), same size, no new machine.
        assert set(after) == set(before)
        for m in before.values():
            assert after[m.id].instance_id == m.instance_id
            assert after[m.id].config.guest.cpus == 0.5
        assert str(client.releases(APP)[0].state) == "failed"
        # The room it held is let go: the worker has its 0.5 back (a 0.5 machine fits there).
        fill(cluster, a.worker_id, 0.5)


def test_a_machine_on_a_cordoned_worker_still_grows_in_place(
    cluster: Cluster, tmp_path: Path
) -> None:
    clear(cluster)
    (tmp_path / "souq.toml").write_text(toml(0.5))
    run = souq(cluster, "deploy", "--config", str(tmp_path / "souq.toml"), "--json")
    assert run.returncode == 0, run.stderr
    with cluster.client() as client:
        (old,) = [m for m in client.list_machines(APP) if m.state is MachineState.STARTED]
        client.cordon(old.worker_id)  # it takes no new machine: no quote of its growth
        try:
            (tmp_path / "souq.toml").write_text(toml(1.0))
            run = souq(cluster, "deploy", "--config", str(tmp_path / "souq.toml"), "--json")
            assert run.returncode == 0, run.stderr
            (new,) = [m for m in client.list_machines(APP) if m.state is MachineState.STARTED]
        finally:
            client.uncordon(old.worker_id)
    assert (new.id, new.worker_id, new.config.guest.cpus) == (old.id, old.worker_id, 1.0)
