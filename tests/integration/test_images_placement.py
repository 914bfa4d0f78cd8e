"""The image cache as a scheduling resource, on a real cluster: workers say what they cache,
placement prefers the worker that has a machine's image (and says why), and a worker's cache
stays within ``--image-cache-mb``, least recently used out first, never an image in use."""

from __future__ import annotations

import os
from pathlib import Path

from souq.images import layout_tar, pack_directory
from souq.model.machine import Machine, MachineState
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec

ONE_SHOT = {"restart": {"policy": "no"}}


CLUSTER = ClusterSpec("images-placement", regions={"mad": 3}, cpus=16, memory_mb=16384)


def build(cluster: Cluster, root: Path, noise: int) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "noise.bin").write_bytes(os.urandom(noise))
    image = pack_directory(root, cmd=["true"])
    with cluster.client() as client:
        return client.push_image(layout_tar(image)).reference


def run(cluster: Cluster, app: str, region: str, reference: str) -> Machine:
    with cluster.client() as client:
        machine = client.create_machine(app, region, {**ONE_SHOT, "image": reference})
        return client.wait(app, machine.id, MachineState.STOPPED, timeout=60)


def cached_on(cluster: Cluster, reference: str) -> set[str]:
    with cluster.client() as client:
        return {w.id for w in client.workers() if reference in w.images}


def test_placement_prefers_the_worker_that_caches_the_image(
    cluster: Cluster, tmp_path: Path
) -> None:
    reference = build(cluster, tmp_path / "big", noise=16 * 2**20)
    first = run(cluster, "warm-0", "mad", reference)
    with cluster.client() as client:
        client.destroy("warm-0", first.id)
    wait_until(
        lambda: cached_on(cluster, reference) == {first.worker_id},
        timeout=30,
        message="the worker to list the image it pulled",
    )
    # Every worker is empty again; only the cache tells them apart. Each machine is of another
    # app (no anti-affinity), destroyed before the next: the cache decides every time.
    for i in range(1, 6):
        machine = run(cluster, f"warm-{i}", "mad", reference)
        assert machine.worker_id == first.worker_id
        assert machine.placement is not None and machine.placement.cached is True
        scores = {o.worker_id: o.scores for o in machine.placement.offers}
        assert scores[first.worker_id]["cache"] == 1.0
        assert all(s["cache"] < 1.0 for w, s in scores.items() if w != first.worker_id)
        with cluster.client() as client:
            client.destroy(f"warm-{i}", machine.id)


def test_the_cache_stays_within_its_bound_and_keeps_images_in_use(
    cluster: Cluster, tmp_path: Path
) -> None:
    small = cluster.add_agent("ams", image_cache_mb=1)
    cluster.wait_for_workers()
    # Each image takes about 600 kB in the cache (its layer, and its files unpacked): two of
    # them do not fit in 1 MiB.
    a = build(cluster, tmp_path / "a", noise=300_000)
    b = build(cluster, tmp_path / "b", noise=300_000)
    keep = run(cluster, "lru", "ams", a)  # stopped, not destroyed: it keeps using image a
    assert keep.worker_id == small.worker_id
    other = run(cluster, "lru", "ams", b)
    wait_until(
        lambda: small.worker_id in cached_on(cluster, a) & cached_on(cluster, b),
        timeout=30,
        message="both images cached while machines use them",
    )
    with cluster.client() as client:
        client.destroy("lru", keep.id)  # a is no longer used, and least recently used
    wait_until(
        lambda: small.worker_id not in cached_on(cluster, a),
        timeout=30,
        message="the unused image to be evicted",
    )
    assert small.worker_id in cached_on(cluster, b)
    with cluster.client() as client:
        client.destroy("lru", other.id)
