"""Machines that run images, on a real cluster (nats-server with JetStream, agents, a broker):
the image's files are the working directory, its command and env apply unless the machine gives
its own, a worker pulls once and caches, an unknown image is refused before any capacity is
claimed, and a blob that does not match its digest never runs."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx
import nats
import pytest

from souq.errors import SouqError
from souq.images import layout_tar, pack_directory
from souq.images.store import ImageStore
from souq.model.batch import BatchResult
from souq.model.machine import Machine, MachineState
from souq.testing import Cluster, auth_headers, wait_until
from tests.clusters import ClusterSpec
from tests.integration.images_harness import souq

APP = "img"
ONE_SHOT = {"restart": {"policy": "no"}}


CLUSTER = ClusterSpec("images-run", regions={"mad": 1}, cpus=64, memory_mb=65536)


def build(cluster: Cluster, root: Path, *, greeting: str, size: int = 0, **run: object) -> str:
    """An image of a small app (and ``size`` bytes of noise) stored in the cluster."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "greeting.txt").write_text(greeting + "\n")
    (root / "show.sh").write_text(
        '#!/bin/sh\necho "cwd=$(pwd)"\necho "file=$(cat greeting.txt)"\necho "env=$GREETING"\n'
    )
    (root / "show.sh").chmod(0o755)
    if size:
        (root / "noise.bin").write_bytes(os.urandom(size))
    cmd = run.pop("cmd", ["./show.sh"])
    image = pack_directory(root, cmd=cmd, env={"GREETING": greeting}, **run)  # type: ignore[arg-type]
    with cluster.client() as client:
        return client.push_image(layout_tar(image)).reference


def run_once(cluster: Cluster, config: dict[str, object]) -> Machine:
    with cluster.client() as client:
        machine = client.create_machine(APP, "mad", {**ONE_SHOT, **config})
        return client.wait(APP, machine.id, MachineState.STOPPED, timeout=60)


def logs(cluster: Cluster, machine: Machine) -> str:
    with cluster.client() as client:
        return client.logs(APP, machine.id)


def test_a_machine_runs_its_image_command_env_and_files(cluster: Cluster, tmp_path: Path) -> None:
    reference = build(cluster, tmp_path / "app", greeting="salaam")
    machine = run_once(cluster, {"image": reference})
    out = logs(cluster, machine)
    assert "file=salaam" in out and "env=salaam" in out
    cwd = next(line for line in out.splitlines() if line.startswith("cwd="))
    assert cwd.endswith("/rootfs") and "/images/" in cwd
    assert machine.exit_code == 0
    # The first machine pulled the image: the placement record says so, with bytes and time.
    placement = machine.placement
    assert placement is not None and placement.cached is False
    assert placement.image is not None and placement.image.reference == reference
    assert placement.image.bytes_to_pull > 0
    assert placement.image.bytes_pulled == placement.image.bytes_to_pull
    assert placement.image.pull_ms is not None
    with cluster.client() as client:
        events = client.events(APP, machine.id)
    assert any(e.type == "pull" and reference in (e.message or "") for e in events)

    # The next one finds it cached, and the worker lists it.
    again = run_once(cluster, {"image": reference})
    assert again.placement is not None and again.placement.cached is True
    assert again.placement.image is not None and again.placement.image.bytes_to_pull == 0
    assert "file=salaam" in logs(cluster, again)
    with cluster.client() as client:
        (worker,) = client.workers()
    assert reference in worker.images


def test_the_machine_overrides_the_image_command_and_env(cluster: Cluster, tmp_path: Path) -> None:
    reference = build(cluster, tmp_path / "app", greeting="hola")
    machine = run_once(
        cluster,
        {
            "image": reference,
            "cmd": ["sh", "-c", "echo mine=$GREETING; cat greeting.txt"],
            "env": {"GREETING": "override"},
        },
    )
    out = logs(cluster, machine)
    assert "mine=override" in out and "hola" in out


def test_a_named_image_and_a_working_directory(cluster: Cluster, tmp_path: Path) -> None:
    root = tmp_path / "app"
    (root / "srv").mkdir(parents=True)
    (root / "srv" / "where.txt").write_text("inside srv\n")
    image = pack_directory(root, cmd=["cat", "where.txt"], workdir="/srv")
    with cluster.client() as client:
        client.push_image(layout_tar(image), name="where:v1")
    machine = run_once(cluster, {"image": "where:v1"})
    assert "inside srv" in logs(cluster, machine)
    assert machine.placement is not None and machine.placement.image is not None
    assert machine.placement.image.reference == image.reference  # resolved at the create


def test_an_unknown_image_is_refused_before_any_capacity_is_claimed(cluster: Cluster) -> None:
    with cluster.client() as client:
        before = {w.id: w.allocated for w in client.workers()}
        count = len(client.list_machines(APP))
        for ref in ("sha256:" + "0" * 64, "no-such-image:v9"):
            with pytest.raises(SouqError) as caught:
                client.create_machine(APP, "mad", {"image": ref})
            assert caught.value.status == "image_not_found"
            assert caught.value.http_status == 404
        assert {w.id: w.allocated for w in client.workers()} == before
        assert len(client.list_machines(APP)) == count
    # The CLI prints the message and exits non-zero.
    run = souq(cluster, "machine", "run", "--app", APP, "--region", "mad", "--image", "nope:v1")
    assert run.returncode != 0 and "nope:v1" in run.stderr


def test_a_config_without_command_or_image_is_refused(cluster: Cluster) -> None:
    with cluster.client() as client, pytest.raises(SouqError) as caught:
        client.create_machine(APP, "mad", {"cmd": []})
    assert caught.value.http_status == 422 and "image" in caught.value.message


async def _tamper(cluster: Cluster, digest: str) -> None:
    nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
    try:
        store = await ImageStore.open(nc)
        await store.blobs.put(digest.replace(":", "/"), b"not the layer you are looking for")
    finally:
        await nc.close()


def test_a_layer_that_does_not_match_its_digest_never_runs(
    cluster: Cluster, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    reference = build(cluster, tmp_path / "app", greeting="tampered", cmd=["touch", str(marker)])
    with cluster.client() as client:
        record = client.image(reference)
    asyncio.run(_tamper(cluster, record.layers[0].digest))
    with cluster.client() as client:
        machine = client.create_machine(APP, "mad", {**ONE_SHOT, "image": reference})
        failed = client.wait(APP, machine.id, MachineState.FAILED, timeout=60)
        events = client.events(APP, machine.id)
    assert not marker.exists()
    fail = next(e for e in events if e.type == "fail")
    assert reference in (fail.message or "") and "digest" in (fail.message or "")
    assert failed.pid is None


def test_machines_of_one_image_at_once_pull_it_once(cluster: Cluster, tmp_path: Path) -> None:
    reference = build(cluster, tmp_path / "app", greeting="together", size=2 * 2**20)
    config = {**ONE_SHOT, "image": reference, "guest": {"memory_mb": 64}}
    body = {"region": "mad", "config": config, "count": 3}
    r = httpx.post(
        f"{cluster.api_url}/v1/apps/{APP}/machines/batch",
        json=body,
        timeout=60,
        headers=auth_headers(),
    )
    assert r.status_code == 201, r.text
    batch = BatchResult.model_validate_json(r.text)
    assert batch.placed == 3
    with cluster.client() as client:
        size = client.image(reference).size
        done = [client.wait(APP, m.id, MachineState.STOPPED, timeout=60) for m in batch.machines]
    pulled = [m.placement.image.bytes_pulled for m in done if m.placement and m.placement.image]
    assert len(pulled) == 3 and sum(p or 0 for p in pulled) == size  # one pull, shared


def test_the_cache_outlives_an_agent_restart(cluster: Cluster, tmp_path: Path) -> None:
    reference = build(cluster, tmp_path / "app", greeting="again")
    run_once(cluster, {"image": reference})
    agent = cluster.agents[0]
    agent.stop()
    agent.start()
    cluster.wait_for_workers()
    with cluster.client() as client:
        wait_until(
            lambda: reference in client.workers()[0].images,
            timeout=30,
            message="the restarted worker to list the image",
        )
    machine = run_once(cluster, {"image": reference})
    assert machine.placement is not None and machine.placement.cached is True
    assert "file=again" in logs(cluster, machine)


def test_dry_run_and_explain_show_the_cache_scorer(cluster: Cluster, tmp_path: Path) -> None:
    reference = build(cluster, tmp_path / "app", greeting="explained")
    run_once(cluster, {"image": reference})
    with cluster.client() as client:
        wait_until(
            lambda: reference in client.workers()[0].images,
            timeout=30,
            message="the worker to list the image",
        )
    run = souq(
        cluster, "machine", "run", "--app", APP, "--region", "mad", "--image", reference,
        "--dry-run", "--json",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    best = record["offers"][0]
    assert best["scores"]["cache"] == 1.0
    assert record["weights"]["cache"] == 1.0
