"""Images on a real cluster (nats-server, agents, a broker on loopback), measured side by side:

* **warm start** — create→started of a machine whose image is cached on its worker, against a
  machine of the same command without an image, alternated on one worker (ratio of medians);
* **cold start** — create→started of a machine whose 64 MiB image its worker has not pulled,
  and the pull's rate as the worker recorded it (bytes / ``pull_ms``);
* **locality** — a region of 8 workers, 2 of which cache a 64 MiB image: the share of that
  image's machines placed on those 2 while they have room (8 machines, 4 fit on each);
* **bytes pulled** — 20 machines of a 64 MiB image onto 4 empty workers that take 8 each: the
  bytes the workers pulled against the least that could do (3 workers must pull it).
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from souq.client.api import SouqClient
from souq.images import layout_tar, pack_directory
from souq.model.machine import Machine, MachineState
from souq.testing import Cluster, wait_until

SIZE = 64 * 2**20
SLEEP = ["sleep", "3600"]
GUEST = {"cpus": 1, "memory_mb": 64}


def _image(root: Path, client: SouqClient, tag: str) -> tuple[str, int]:
    src = root / f"src-{tag}"
    src.mkdir()
    (src / "data.bin").write_bytes(os.urandom(SIZE))
    (src / "tag").write_text(tag)
    record = client.push_image(layout_tar(pack_directory(src, cmd=SLEEP)))
    return record.reference, record.size


def _create(client: SouqClient, app: str, region: str, config: dict[str, Any]) -> Machine:
    machine = client.create_machine(app, region, {"guest": GUEST, **config})
    if machine.state is not MachineState.STARTED:
        machine = client.wait(app, machine.id, MachineState.STARTED, timeout=120)
    return machine


def _timed(client: SouqClient, app: str, region: str, config: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    machine = _create(client, app, region, config)
    took = time.perf_counter() - t0
    client.destroy(app, machine.id, force=True)
    return took


def _warm_and_cold(client: SouqClient, root: Path, rounds: int) -> dict[str, Any]:
    reference, size = _image(root, client, "warm")
    t0 = time.perf_counter()
    first = _create(client, "cold", "w", {"image": reference})
    cold_s = time.perf_counter() - t0
    pull = first.placement.image if first.placement else None
    client.destroy("cold", first.id, force=True)
    plain, warm = [], []
    for _ in range(rounds):
        plain.append(_timed(client, "plain", "w", {"cmd": SLEEP}))
        warm.append(_timed(client, "warm", "w", {"image": reference}))
    p50_plain, p50_warm = statistics.median(plain), statistics.median(warm)
    return {
        "warm_start": {
            "rounds": rounds,
            "no_image_p50_ms": round(p50_plain * 1000, 2),
            "cached_image_p50_ms": round(p50_warm * 1000, 2),
            "ratio": round(p50_warm / p50_plain, 2),
        },
        "cold_start": {
            "image_bytes": size,
            "create_to_started_ms": round(cold_s * 1000, 1),
            "pull_ms": pull.pull_ms if pull else None,
            "pull_mb_per_s": round(size / (pull.pull_ms / 1000) / 1e6, 1)
            if pull and pull.pull_ms
            else None,
            "create_to_started_mb_per_s": round(size / cold_s / 1e6, 1),
        },
    }


def _locality(cluster: Cluster, client: SouqClient, root: Path) -> dict[str, Any]:
    reference, _ = _image(root, client, "locality")
    holders = [a.worker_id for a in cluster.agents if a.region == "p"][:2]
    for rack in ("1", "2"):  # warm two workers' caches, then free them again
        config = {"image": reference, "constraints": [_rack(rack)]}
        warmed = _create(client, "warm-up", "p", config)
        client.destroy("warm-up", warmed.id, force=True)
    wait_until(
        lambda: all(reference in w.images for w in client.workers() if w.id in holders),
        timeout=30,
        message="both workers to list the image",
    )
    placed = [_create(client, "local", "p", {"image": reference}) for _ in range(8)]
    on_holders = sum(1 for m in placed if m.worker_id in holders)
    # Past their room the next machines go elsewhere: capacity rules are not defeated.
    spill = [_create(client, "local", "p", {"image": reference}) for _ in range(2)]
    return {
        "workers": 8,
        "caching": 2,
        "machines": len(placed),
        "on_caching_workers": on_holders,
        "share": round(on_holders / len(placed), 3),
        "past_their_room_elsewhere": sum(1 for m in spill if m.worker_id not in holders),
    }


def _rack(n: str) -> dict[str, Any]:
    return {"attribute": "label.rack", "operator": "=", "value": n}


def _bytes_pulled(client: SouqClient, root: Path) -> dict[str, Any]:
    reference, size = _image(root, client, "bytes")
    machines = [_create(client, "many", "b", {"image": reference}) for _ in range(20)]
    pulled = sum(
        (m.placement.image.bytes_pulled or 0)
        for m in machines
        if m.placement is not None and m.placement.image is not None
    )
    least = math.ceil(20 / 8) * size
    return {
        "machines": 20,
        "workers": 4,
        "per_worker": 8,
        "workers_used": len({m.worker_id for m in machines}),
        "bytes_pulled": pulled,
        "minimum_bytes": least,
        "ratio": round(pulled / least, 3),
    }


def run(rounds: int = 15) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="souq-bench-image-cluster-") as tmp:
        root = Path(tmp)
        with Cluster(root / "cluster", regions={"w": 1}, cpus=8, memory_mb=8192) as cluster:
            for rack in range(1, 9):
                cluster.add_agent("p", cpus=4, labels={"rack": str(rack)})
            for _ in range(4):
                cluster.add_agent("b", cpus=8)
            cluster.wait_for_workers()
            with cluster.client(timeout=120) as client:
                out = _warm_and_cold(client, root, rounds)
                out["locality"] = _locality(cluster, client, root)
                out["bytes_pulled"] = _bytes_pulled(client, root)
    return out
