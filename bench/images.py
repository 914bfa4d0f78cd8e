"""Pulling an image: a 64 MiB image from the cluster's store (JetStream's object store on a
nats-server on loopback) into a worker's cache, beside its floors in the same run.

Suite ``images`` (``python -m bench images``). The image is one layer of 64 MiB of random bytes
(gzip cannot shrink them, so the pull moves 64 MiB). Each round, with a fresh cache:

* **fetch** — the layer's bytes from the store (``ImageStore.blob``: the object store's chunks
  over NATS, and the digest check);
* **cold start** — ``ImageCache.ensure``: the layer streamed from the store, hashed, written
  and unpacked as it arrives (:mod:`souq.images.stream`);
* **floor: local** — the same work fed from a file on this disk instead of the store (read,
  then hash, write and unpack): what the cache costs without the network;
* **warm** — ``ensure`` again with the image cached.

Rates are MB/s (10^6 bytes) of the layer's size, medians of ``IMAGES_ROUNDS`` (default 5).

Then the same in a cluster, and placement by cache (:mod:`bench.image_cluster`): warm and cold
starts, the share of an image's machines on the workers that cache it, and the bytes pulled
for 20 machines against the least possible.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats

from bench import image_cluster
from bench.stats import machine_line
from souq.images import pack_directory
from souq.images.cache import ImageCache
from souq.images.manifest import record_of
from souq.images.store import ImageStore
from souq.natsserver import NatsServer

SIZE = 64 * 2**20
CHUNK = 128 * 1024  # the object store's chunk size
ROUNDS = 5
START_ROUNDS = 15  # create→started pairs (no image, cached image)


async def _rounds(url: str, root: Path, rounds: int) -> dict[str, Any]:
    src = root / "src"
    src.mkdir()
    (src / "data.bin").write_bytes(os.urandom(SIZE))
    image = pack_directory(src, cmd=["true"])
    record = record_of(image)
    layer = record.layers[0]
    local_blob = root / "layer.blob"
    local_blob.write_bytes(image.blobs[layer.digest])
    nc = await nats.connect(url)
    times: dict[str, list[float]] = {"fetch": [], "cold": [], "local": [], "warm": []}
    try:
        store = await ImageStore.open(nc)
        await store.put(image)
        for i in range(rounds):
            t0 = time.perf_counter()
            await store.blob(layer.digest)
            times["fetch"].append(time.perf_counter() - t0)

            cache = ImageCache(root / f"cold-{i}", limit_bytes=2**31, fetch=store.stream)
            t0 = time.perf_counter()
            await cache.ensure(record)
            times["cold"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await cache.ensure(record)
            times["warm"].append(time.perf_counter() - t0)

            async def from_disk(digest: str, sink: Callable[[bytes], None]) -> None:
                data = await asyncio.to_thread(local_blob.read_bytes)
                for at in range(0, len(data), CHUNK):
                    sink(data[at : at + CHUNK])

            local = ImageCache(root / f"local-{i}", limit_bytes=2**31, fetch=from_disk)
            t0 = time.perf_counter()
            await local.ensure(record)
            times["local"].append(time.perf_counter() - t0)
    finally:
        await nc.close()
    out: dict[str, Any] = {"layer_bytes": layer.size, "rounds": rounds}
    for name, values in times.items():
        p50 = statistics.median(values)
        out[name] = {
            "p50_ms": round(p50 * 1000, 1),
            "mb_per_s": round(layer.size / p50 / 1e6, 1) if name != "warm" else None,
        }
    out["cold_vs_local"] = round(out["cold"]["p50_ms"] / out["local"]["p50_ms"], 2)
    return out


def images() -> None:
    rounds = int(os.environ.get("IMAGES_ROUNDS", ROUNDS))
    print(f"# images benchmark — a 64 MiB image pulled into a cache — {machine_line()}")
    with tempfile.TemporaryDirectory(prefix="souq-bench-images-") as tmp, NatsServer() as server:
        results = asyncio.run(_rounds(server.url, Path(tmp), rounds))
    cluster = image_cluster.run(int(os.environ.get("IMAGES_START_ROUNDS", START_ROUNDS)))
    results = {
        "command": "python -m bench images",
        "machine": machine_line(),
        "pull": results,
        **cluster,
    }
    print(json.dumps(results, indent=2))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "images.json").write_text(json.dumps(results, indent=2) + "\n")


def main() -> None:
    images()
