"""Images in the cluster's store (JetStream on a real nats-server), through the broker's API and
the CLI, as a user builds, imports and lists them."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from pathlib import Path

import httpx
import nats
import pytest

from souq.images import layout_tar, pack_directory, read_layout_bytes, write_layout
from souq.images.cache import ImageCache
from souq.images.store import ImageStore
from souq.model.image import ImageRecord
from souq.testing import Cluster, auth_headers
from tests.clusters import ClusterSpec
from tests.integration.images_harness import souq

CLUSTER = ClusterSpec("images", regions={"mad": 1})


def app_dir(root: Path, greeting: str = "hello") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "app.py").write_text(f"print({greeting!r})\n")
    (root / "static").mkdir(exist_ok=True)
    (root / "static" / "index.html").write_text("<h1>hi</h1>\n")
    return root


async def _blobs(cluster: Cluster, digests: list[str]) -> list[bytes]:
    nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
    try:
        store = await ImageStore.open(nc)
        return [await store.blob(d) for d in digests]
    finally:
        await nc.close()


def test_build_stores_the_image_and_list_shows_it(cluster: Cluster, tmp_path: Path) -> None:
    src = app_dir(tmp_path / "web")
    run = souq(cluster, "image", "build", str(src), "--name", "web:v1", "--cmd", "python3 app.py")
    assert run.returncode == 0, run.stderr
    reference = run.stdout.strip()
    assert reference.startswith("sha256:") and len(reference) == 71
    # The same files make the same image: the reference is reproducible.
    assert reference == pack_directory(src, cmd=["python3", "app.py"]).reference

    listed = souq(cluster, "image", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    records = {r["reference"]: r for r in json.loads(listed.stdout)}
    assert records[reference]["name"] == "web:v1"
    assert records[reference]["run"]["cmd"] == ["python3", "app.py"]

    by_name = httpx.get(
        f"{cluster.api_url}/v1/images/web:v1", timeout=10, headers=auth_headers()
    ).json()
    assert by_name["reference"] == reference
    # Every blob is in JetStream's object store, and reads back as its digest says.
    digests = [layer["digest"] for layer in by_name["layers"]] + [by_name["config_digest"]]
    blobs = asyncio.run(_blobs(cluster, digests))
    assert [len(b) for b in blobs[:-1]] == [layer["size"] for layer in by_name["layers"]]


def test_import_reads_an_oci_layout_and_keeps_its_reference(
    cluster: Cluster, tmp_path: Path
) -> None:
    image = pack_directory(app_dir(tmp_path / "src", "imported"), cmd=["python3", "app.py"])
    layout = tmp_path / "layout"
    write_layout(image, layout)
    run = souq(cluster, "image", "import", str(layout), "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["reference"] == image.reference
    # The tar form of the same layout is the same image.
    tar = tmp_path / "layout.tar"
    tar.write_bytes(layout_tar(image))
    again = souq(cluster, "image", "import", str(tar))
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == image.reference


def test_a_tampered_upload_is_refused_and_nothing_is_stored(
    cluster: Cluster, tmp_path: Path
) -> None:
    image = pack_directory(app_dir(tmp_path / "t", "tampered"), cmd=["true"])
    layer = image.layers[0].digest.split(":", 1)[1]
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(layout_tar(image))) as src,
        tarfile.open(fileobj=out, mode="w") as dst,
    ):
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            if data is not None and member.name.endswith(layer):
                data = data[:-1] + bytes([data[-1] ^ 1])
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    with pytest.raises(Exception, match=layer[:12]):
        read_layout_bytes(out.getvalue())
    r = httpx.post(
        f"{cluster.api_url}/v1/images", content=out.getvalue(), timeout=30, headers=auth_headers()
    )
    assert r.status_code == 422
    assert r.json()["status"] == "image_invalid"
    assert layer[:12] in r.json()["error"]
    missing = httpx.get(
        f"{cluster.api_url}/v1/images/{image.reference}", timeout=10, headers=auth_headers()
    )
    assert missing.status_code == 404


def test_unknown_images_and_bad_uploads_get_clear_errors(cluster: Cluster) -> None:
    r = httpx.get(f"{cluster.api_url}/v1/images/nothing-here", timeout=10, headers=auth_headers())
    assert r.status_code == 404
    assert r.json()["status"] == "image_not_found"
    r = httpx.post(f"{cluster.api_url}/v1/images", content=b"", timeout=10, headers=auth_headers())
    assert r.status_code in (400, 422)
    assert "OCI image layout" in r.json()["error"]
    r = httpx.post(
        f"{cluster.api_url}/v1/images",
        content=b"not a tar at all",
        timeout=10,
        headers=auth_headers(),
    )
    assert r.status_code == 422
    assert r.json()["status"] == "image_invalid"
    run = souq(cluster, "image", "build", "/definitely/not/here")
    assert run.returncode != 0
    assert "error:" in run.stderr


def test_a_worker_cache_pulls_from_the_cluster_store(cluster: Cluster, tmp_path: Path) -> None:
    src = app_dir(tmp_path / "pulled", "pulled")
    run = souq(cluster, "image", "build", str(src), "--cmd", "python3 app.py")
    assert run.returncode == 0, run.stderr
    record = httpx.get(
        f"{cluster.api_url}/v1/images/{run.stdout.strip()}", timeout=10, headers=auth_headers()
    ).json()

    async def pull() -> tuple[Path, int]:
        nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
        try:
            store = await ImageStore.open(nc)
            cache = ImageCache(tmp_path / "cache", limit_bytes=2**30, fetch=store.stream)
            rec = ImageRecord.model_validate(record)
            roots = await asyncio.gather(*(cache.ensure(rec) for _ in range(4)))
            assert len(set(roots)) == 1
            return roots[0], cache.stats.bytes_pulled
        finally:
            await nc.close()

    root, pulled = asyncio.run(pull())
    assert (root / "app.py").read_text() == "print('pulled')\n"
    assert (root / "static" / "index.html").exists()
    assert pulled == record["size"]  # each layer once, for four machines
