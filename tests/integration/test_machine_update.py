"""Updating a machine in place (``POST /v1/apps/{app}/machines/{id}``) on a real cluster: the
machine keeps its worker, gets a new ``instance_id`` and restarts with the new config; a size
the worker cannot give is refused with nothing changed; the new config outlives an agent
restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from souq.errors import SouqError
from souq.images import layout_tar, pack_directory
from souq.model.machine import Machine, MachineState
from souq.testing import Cluster, auth_headers, wait_until
from tests.clusters import ClusterSpec

APP = "upd"


CLUSTER = ClusterSpec("update", regions={"mad": 1}, cpus=2, memory_mb=2048)


def says(word: str) -> list[str]:
    return ["sh", "-c", f"echo {word} $COLOUR; exec sleep 600"]


def logged(cluster: Cluster, machine: Machine, text: str) -> None:
    with cluster.client() as client:
        wait_until(
            lambda: text in client.logs(APP, machine.id), timeout=30, message=f"{text!r} logged"
        )


def test_an_update_restarts_the_machine_with_its_new_config(cluster: Cluster) -> None:
    with cluster.client() as client:
        first = client.create_machine(
            APP, "mad", {"cmd": says("one"), "env": {"COLOUR": "red"}, "guest": {"cpus": 1}}
        )
        logged(cluster, first, "one red")
        updated = client.update(
            APP, first.id, {"cmd": says("two"), "env": {"COLOUR": "blue"}, "guest": {"cpus": 1}}
        )
        assert updated.state is MachineState.STARTED
        assert updated.worker_id == first.worker_id
        assert updated.instance_id and updated.instance_id != first.instance_id
        assert updated.pid != first.pid
        assert updated.config.env == {"COLOUR": "blue"}
        logged(cluster, updated, "two blue")
        events = client.events(APP, first.id)
        update = next(e for e in events if e.type == "update")
        assert updated.instance_id in (update.message or "")
        client.destroy(APP, first.id, force=True)


def test_a_size_the_worker_cannot_give_is_refused_and_nothing_changes(cluster: Cluster) -> None:
    with cluster.client() as client:
        machine = client.create_machine(APP, "mad", {"cmd": says("small"), "guest": {"cpus": 1}})
        with pytest.raises(SouqError) as caught:
            client.update(APP, machine.id, {"cmd": says("big"), "guest": {"cpus": 4}})
        assert caught.value.status == "insufficient_capacity"
        assert caught.value.http_status == 409
        after = client.get_machine(APP, machine.id)
        assert (after.instance_id, after.pid, after.config.cmd) == (
            machine.instance_id,
            machine.pid,
            machine.config.cmd,
        )
        # Growing into what the worker has free is fine (2 cpus, this machine's 1 included).
        grown = client.update(APP, machine.id, {"cmd": says("grown"), "guest": {"cpus": 2}})
        assert grown.config.guest.cpus == 2
        (worker,) = client.workers()
        assert worker.allocated.cpus == 2
        client.destroy(APP, machine.id, force=True)


def test_a_stopped_machine_stays_stopped_with_skip_launch(cluster: Cluster) -> None:
    with cluster.client() as client:
        machine = client.create_machine(APP, "mad", {"cmd": says("idle")})
        client.stop(APP, machine.id)
        client.wait(APP, machine.id, MachineState.STOPPED, timeout=30)
        kept = client.update(APP, machine.id, {"cmd": says("later")}, skip_launch=True)
        assert kept.state is MachineState.STOPPED and kept.config.cmd == says("later")
        started = client.start(APP, machine.id)
        logged(cluster, started, "later")
        client.destroy(APP, machine.id, force=True)


def test_an_update_to_an_image_and_across_an_agent_restart(
    cluster: Cluster, tmp_path: Path
) -> None:
    src = tmp_path / "app"
    src.mkdir()
    (src / "hello.txt").write_text("from the image\n")
    image = pack_directory(src, cmd=["sh", "-c", "cat hello.txt; exec sleep 600"])
    with cluster.client() as client:
        reference = client.push_image(layout_tar(image)).reference
        machine = client.create_machine(APP, "mad", {"cmd": says("plain")})
        updated = client.update(APP, machine.id, {"image": reference})
        assert updated.placement is not None and updated.placement.image is not None
        assert updated.placement.image.reference == reference
        logged(cluster, updated, "from the image")
    agent = cluster.agents[0]
    agent.stop()
    agent.start()
    cluster.wait_for_workers()
    with cluster.client() as client:
        again = client.get_machine(APP, machine.id)
        assert again.instance_id == updated.instance_id
        assert again.config.image == reference and again.config.cmd == []
        client.destroy(APP, machine.id, force=True)


def test_the_cli_changes_one_part_of_the_config(cluster: Cluster) -> None:
    from tests.integration.images_harness import souq

    with cluster.client() as client:
        machine = client.create_machine(
            APP, "mad", {"cmd": says("cli"), "env": {"COLOUR": "green", "KEEP": "1"}}
        )
    run = souq(cluster, "machine", "update", machine.id, "--app", APP, "-e", "COLOUR=gold")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [machine.id, "started"]
    with cluster.client() as client:
        after = client.get_machine(APP, machine.id)
        assert after.config.env == {"COLOUR": "gold", "KEEP": "1"}
        assert after.config.cmd == machine.config.cmd
        logged(cluster, after, "cli gold")
        client.destroy(APP, machine.id, force=True)
    bad = souq(cluster, "machine", "update", machine.id, "--app", APP, "--cpus", "64")
    assert bad.returncode != 0 and "destroyed" in bad.stderr


def test_a_leased_machine_changes_only_with_the_nonce(cluster: Cluster) -> None:
    import httpx

    with cluster.client() as client:
        machine = client.create_machine(APP, "mad", {"cmd": says("leased")})
        lease = client.take_lease(APP, machine.id, ttl_s=60, description="deploy v7")
        assert client.lease(APP, machine.id).nonce == lease.nonce
        # Without the nonce (or with a wrong one) every change is refused, nothing happens.
        for change in (
            lambda: client.stop(APP, machine.id),
            lambda: client.update(APP, machine.id, {"cmd": says("sneaky")}),
            lambda: client.destroy(APP, machine.id, force=True),
            lambda: client.stop(APP, machine.id, nonce="not-the-nonce"),
            lambda: client.take_lease(APP, machine.id),
        ):
            with pytest.raises(SouqError) as caught:
                change()
            assert caught.value.status == "lease_held" and caught.value.http_status == 409
            assert "deploy v7" in caught.value.message
        assert client.get_machine(APP, machine.id).state is MachineState.STARTED
        # Reads need no nonce; with it, changes go through and the lease can be extended.
        extended = client.take_lease(APP, machine.id, ttl_s=120, nonce=lease.nonce)
        assert extended.nonce == lease.nonce and extended.version == 2
        assert extended.expires_at > lease.expires_at
        updated = client.update(APP, machine.id, {"cmd": says("mine")}, nonce=lease.nonce)
        logged(cluster, updated, "mine")
    # The lease outlives an agent restart.
    agent = cluster.agents[0]
    agent.stop()
    agent.start()
    cluster.wait_for_workers()
    with cluster.client() as client:
        assert client.lease(APP, machine.id).nonce == lease.nonce
        r = httpx.delete(
            f"{cluster.api_url}/v1/apps/{APP}/machines/{machine.id}/lease",
            timeout=30,
            headers=auth_headers(),
        )
        assert r.status_code == 409 and r.json()["status"] == "lease_held"
        client.release_lease(APP, machine.id, lease.nonce)
        with pytest.raises(SouqError) as caught:
            client.lease(APP, machine.id)
        assert caught.value.status == "not_found"
        client.destroy(APP, machine.id, force=True)  # free again


def test_a_graceful_destroy_stops_the_machine_first(cluster: Cluster) -> None:
    stubborn = ["sh", "-c", "trap '' INT; echo up; exec sleep 600"]
    with cluster.client() as client:
        machine = client.create_machine(
            APP, "mad", {"cmd": stubborn, "stop_config": {"signal": "SIGINT", "timeout_s": 1}}
        )
        logged(cluster, machine, "up")
        leaving = client.destroy(APP, machine.id, graceful=True)
        assert leaving.state is MachineState.DESTROYING  # out of rotation, at once
        gone = client.wait(APP, machine.id, MachineState.DESTROYED, timeout=30)
        kinds = [(e.type, e.signal) for e in reversed(client.events(APP, gone.id))]
        # The stop signal first (ignored), SIGKILL after the stop timeout, then destroyed.
        assert ("signal", "SIGKILL") in kinds and kinds[-1][0] == "destroy"
        destroy = next(
            e for e in client.events(APP, gone.id) if "stopping first" in (e.message or "")
        )
        assert "SIGINT" in (destroy.message or "")
        # A stopped machine is simply destroyed.
        idle = client.create_machine(APP, "mad", {"cmd": says("idle")}, skip_launch=True)
        assert client.destroy(APP, idle.id, graceful=True).state is MachineState.DESTROYED
