"""High availability: the machines of a group with services in a region go to distinct workers,
even where cache locality alone would put them on one: the two Souq picks by default, the
counts `[regions]` names, and those `souq scale count` adds."""

from __future__ import annotations

import os
from pathlib import Path

from souq.images import layout_tar, pack_directory
from souq.model.machine import MachineState
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec
from tests.integration.images_harness import souq

CLUSTER = ClusterSpec("ha", regions={"mad": 2}, cpus=2, memory_mb=2048)


def cached_on_one_worker(cluster: Cluster, tmp_path: Path, text: str) -> str:
    """``text`` as souq.toml beside a 64 MiB file, packed and pushed, and run once so that one
    worker only caches it: cache locality alone would put every machine of it there (it
    outweighs anti-affinity). Its reference."""
    (tmp_path / "noise.bin").write_bytes(os.urandom(64 * 2**20))
    (tmp_path / "souq.toml").write_text(text)
    image = pack_directory(tmp_path)
    with cluster.client() as client:
        reference = client.push_image(layout_tar(image), name=f"{tmp_path.name}:latest").reference
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
        client.destroy("warm", warm.id, force=True)
    return reference


def started(cluster: Cluster, app: str) -> list[str]:
    """The workers of the app's started machines, one a machine."""
    with cluster.client() as client:
        return [m.worker_id for m in client.list_machines(app) if m.state is MachineState.STARTED]


def test_explicit_counts_and_scale_count_spread_too(cluster: Cluster, tmp_path: Path) -> None:
    text = """\
app = "counted"
primary_region = "mad"
[processes]
app = "sleep 600"
[http_service]
internal_port = 8080
[[vm]]
cpus = 0.25
memory_mb = 64
[regions]
mad = 1
"""
    reference = cached_on_one_worker(cluster, tmp_path, text)
    toml = str(tmp_path / "souq.toml")
    run = souq(cluster, "deploy", "--config", toml, "--image", reference)
    assert run.returncode == 0, run.stderr
    # `souq scale count`: the new machine goes to the other worker, away from the first.
    run = souq(cluster, "scale", "count", "2", "--app", "counted")
    assert run.returncode == 0, run.stderr
    assert len(started(cluster, "counted")) == 2
    assert len(set(started(cluster, "counted"))) == 2
    # [regions] naming 3 in a region of two workers: two spread, the third shares, and the
    # deploy says that mad cannot spread.
    (tmp_path / "souq.toml").write_text(text.replace("mad = 1", "mad = 3"))
    run = souq(cluster, "deploy", "--config", toml, "--image", reference)
    assert run.returncode == 0, run.stderr
    assert len(started(cluster, "counted")) == 3
    assert len(set(started(cluster, "counted"))) == 2
    assert (
        "mad cannot spread app: every worker there (2) already runs one of its machines"
        in run.stdout
    )


def test_the_two_machines_of_a_served_group_go_to_distinct_workers(
    cluster: Cluster, tmp_path: Path
) -> None:
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
    reference = cached_on_one_worker(cluster, tmp_path, text)
    run = souq(cluster, "deploy", "--config", str(tmp_path / "souq.toml"), "--image", reference)
    assert run.returncode == 0, run.stderr
    assert len(started(cluster, "ha")) == 2
    assert len(set(started(cluster, "ha"))) == 2
