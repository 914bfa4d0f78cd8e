"""High availability by default: the two machines of a group with services go to distinct
workers of the primary region, even where cache locality alone would put both on one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from souq.images import layout_tar, pack_directory
from souq.model.machine import MachineState
from souq.testing import Cluster, wait_until
from tests.integration.images_harness import souq


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("ha")
    with Cluster(root, regions={"mad": 2}, cpus=2, memory_mb=2048) as c:
        yield c


def test_the_two_machines_of_a_served_group_go_to_distinct_workers(
    cluster: Cluster, tmp_path: Path
) -> None:
    # A 64 MiB image cached on one worker only: cache locality alone would put both machines
    # there (it outweighs anti-affinity); high availability puts them on two workers.
    (tmp_path / "noise.bin").write_bytes(os.urandom(64 * 2**20))
    text = """\
app = "ha"
primary_region = "mad"
[build]
dir = "."
[processes]
app = "sleep 600"
[http_service]
internal_port = 8080
[[vm]]
cpus = 0.25
memory_mb = 64
"""
    (tmp_path / "souq.toml").write_text(text)
    image = pack_directory(tmp_path)
    with cluster.client() as client:
        reference = client.push_image(layout_tar(image), name="ha:latest").reference
        warm = client.create_machine(
            "warm",
            "mad",
            {"image": reference, "cmd": ["true"], "restart": {"policy": "no"}},
        )
        client.wait("warm", warm.id, MachineState.STOPPED, timeout=60)
        wait_until(
            lambda: [w.id for w in client.workers() if reference in w.images] == [warm.worker_id],
            timeout=30,
            message="one worker to cache the image",
        )
    run = souq(cluster, "deploy", "--config", str(tmp_path / "souq.toml"), "--image", reference)
    assert run.returncode == 0, run.stderr
    with cluster.client() as client:
        placed = [m for m in client.list_machines("ha") if m.state is MachineState.STARTED]
    assert len(placed) == 2
    assert len({m.worker_id for m in placed}) == 2
