"""Images by their registry's name, with no registry in reach: an operator imports an OCI tar
under ``docker.io/library/busybox:latest`` and machines naming it in any of Docker's spellings
run it from the cluster's store, never asking Docker Hub (this host reaches no registry: a dial
out would fail the create). Real NATS with JetStream, a real agent and broker, the `souq` CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import nats
import pytest

from souq.errors import SouqError
from souq.images import Image, layout_tar, pack_directory
from souq.images.store import ImageStore
from souq.model.machine import MachineState
from souq.natsserver import free_port
from souq.testing import Cluster, auth_headers
from tests.clusters import ClusterSpec
from tests.integration.images_harness import souq

APP = "named"
SPELLINGS = (
    "busybox",
    "library/busybox",
    "docker.io/library/busybox:latest",
    "registry-1.docker.io/library/busybox:latest",
)


CLUSTER = ClusterSpec("names", regions={"mad": 1}, cpus=16)


def _image(root: Path, greeting: str) -> Image:
    root.mkdir(parents=True, exist_ok=True)
    (root / "greeting.txt").write_text(greeting + "\n")
    return pack_directory(root, cmd=["cat", "greeting.txt"])


def test_an_imported_image_runs_under_each_spelling_of_its_registry_name(
    cluster: Cluster, tmp_path: Path
) -> None:
    image = _image(tmp_path / "src", "from the store")
    tar = tmp_path / "busybox.tar"
    tar.write_bytes(layout_tar(image))
    run = souq(
        cluster, "image", "import", str(tar), "--name", "docker.io/library/busybox:latest", "--json"
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["reference"] == image.reference

    with cluster.client() as client:
        for spelling in SPELLINGS:
            machine = client.create_machine(
                APP, "mad", {"image": spelling, "restart": {"policy": "no"}}
            )
            done = client.wait(APP, machine.id, MachineState.STOPPED, timeout=60)
            assert "from the store" in client.logs(APP, machine.id), spelling
            assert done.placement is not None and done.placement.image is not None
            assert done.placement.image.reference == image.reference, spelling
            assert done.placement.image.source is None, spelling  # the store, not a registry
            # GET /v1/images/{name} reads every spelling too, slashes and all.
            assert client.image(spelling).reference == image.reference


def test_a_name_not_stored_is_image_not_found_without_asking_a_registry(
    cluster: Cluster,
) -> None:
    # A short name is the store's only: image_not_found (a dial out to Docker Hub would answer
    # 503 on this host), with the command that stores it under that name.
    with cluster.client() as client, pytest.raises(SouqError) as caught:
        client.create_machine(APP, "mad", {"image": "busybox:1.36"})
    assert caught.value.status == "image_not_found"
    assert "--name docker.io/library/busybox:1.36" in (caught.value.hint or "")
    with cluster.client() as client:
        assert not [m for m in client.list_machines(APP) if m.config.image == "busybox:1.36"]


def test_a_registry_out_of_reach_says_how_to_run_its_image_without_it(
    cluster: Cluster,
) -> None:
    """A name written with its registry that the store lacks is asked of that registry; one that
    cannot be reached (nothing listens on its port) answers 503 with the command that stores
    the image under that name."""
    name = f"127.0.0.1:{free_port()}/library/absent:v1"
    with cluster.client() as client, pytest.raises(SouqError) as caught:
        client.create_machine(APP, "mad", {"image": name})
    assert caught.value.status == "unavailable"
    assert "cannot reach the registry" in caught.value.message
    assert f"souq image import PATH --name {name}" in (caught.value.hint or "")


def test_an_apps_token_may_not_store_a_registry_name(cluster: Cluster, tmp_path: Path) -> None:
    """A registry's name stands in for that registry's image for every app: an operator's to
    give. An app's token stores short names as before, and a short name it stores is not what
    a create naming the registry finds (nor one of the cluster's: it is the app's own)."""
    with cluster.client() as admin:
        token = admin.create_token(app="other", scope="deploy").token
    assert token
    headers = {"Authorization": f"Bearer {token}"}
    body = layout_tar(_image(tmp_path / "shadow", "shadowed"))
    with httpx.Client(base_url=cluster.api_url, headers=headers, timeout=60) as app_client:
        refused = app_client.post(
            "/v1/images", params={"name": "docker.io/library/nginx:latest"}, content=body
        )
        assert refused.status_code == 403, refused.text
        assert refused.json()["status"] == "forbidden"
        short = app_client.post("/v1/images", params={"name": "nginx"}, content=body)
        assert short.status_code == 201, short.text
    with httpx.Client(base_url=cluster.api_url, headers=auth_headers(), timeout=30) as http:
        assert http.get("/v1/images/nginx:latest", params={"app": "other"}).status_code == 200
        assert http.get("/v1/images/nginx:latest").status_code == 404  # not the cluster's
        assert http.get("/v1/images/docker.io/library/nginx:latest").status_code == 404


def test_a_bad_name_is_refused_naming_the_field(cluster: Cluster, tmp_path: Path) -> None:
    body = layout_tar(_image(tmp_path / "bad", "bad"))
    with httpx.Client(base_url=cluster.api_url, headers=auth_headers(), timeout=30) as http:
        for name in ("Busy/Box", f"busybox@sha256:{'a' * 64}"):
            r = http.post("/v1/images", params={"name": name}, content=body)
            assert r.status_code == 422, (name, r.text)
            assert r.json()["field"] == "name"


async def _store_as_before(cluster: Cluster, name: str, reference: str) -> None:
    """``name`` written into the store as a store of before normalised names wrote it: its
    own spelling, as the key."""
    nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
    try:
        store = await ImageStore.open(nc)
        await store.records.put("name." + name.encode().hex(), reference.encode())
    finally:
        await nc.close()


def test_a_name_stored_before_names_were_normalised_is_still_found(
    cluster: Cluster, tmp_path: Path
) -> None:
    image = _image(tmp_path / "old", "stored long ago")
    with cluster.client() as client:
        reference = client.push_image(layout_tar(image)).reference
    asyncio.run(_store_as_before(cluster, "old-web_", reference))  # no longer a Docker name
    with cluster.client() as client:
        assert client.image("old-web_").reference == reference
        machine = client.create_machine(
            APP, "mad", {"image": "old-web_", "restart": {"policy": "no"}}
        )
        client.wait(APP, machine.id, MachineState.STOPPED, timeout=60)
        assert "stored long ago" in client.logs(APP, machine.id)
