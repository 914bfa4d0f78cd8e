"""A hostile tenant against image names (issue 31, point 2), on a real cluster with tokens of
two apps: alpha's deploy token pushes under bravo's name, runs bravo's digest, reads bravo's
images, and tries to take over a name an operator stored for every app. Each used to work:
names were the cluster's, so alpha's push of ``bravo-img:1`` was what bravo's next machine ran."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import nats
import pytest

from souq.client.api import SouqClient
from souq.errors import SouqError
from souq.images import Image, layout_tar, pack_directory
from souq.images.store import RECORDS_BUCKET, ImageStore
from souq.model.machine import MachineState
from souq.testing import Cluster
from tests.clusters import ClusterSpec

NO_RESTART = {"restart": {"policy": "no"}}


CLUSTER = ClusterSpec("tenancy-names", regions={"mad": 1}, cpus=16)


@pytest.fixture(scope="module")
def tokens(cluster: Cluster) -> dict[str, str]:
    """A deploy token of each tenant's app (what a tenant's CI holds)."""
    out = {}
    with cluster.client() as admin:
        for app in ("alpha", "bravo"):
            token = admin.create_token(app=app, scope="deploy", name=f"ci of {app}").token
            assert token
            out[app] = token
    return out


def _image(root: Path, says: str) -> Image:
    root.mkdir(parents=True, exist_ok=True)
    (root / "says.txt").write_text(says + "\n")
    return pack_directory(root, cmd=["cat", "says.txt"])


def _ran(client: SouqClient, app: str, image: str) -> tuple[str, str]:
    """What a machine of ``app`` of ``image`` printed, and the digest its record says it ran."""
    machine = client.create_machine(app, "mad", {"image": image, **NO_RESTART})
    done = client.wait(app, machine.id, MachineState.STOPPED, timeout=60)
    return client.logs(app, machine.id), done.image_ref["digest"]


def test_another_apps_push_under_my_name_does_not_reach_my_machines(
    cluster: Cluster, tokens: dict[str, str], tmp_path: Path
) -> None:
    mine = _image(tmp_path / "bravo", "bravo's own files")
    hostile = _image(tmp_path / "alpha", "alpha's files")
    with (
        cluster.client(token=tokens["bravo"]) as bravo,
        cluster.client(token=tokens["alpha"]) as alpha,
    ):
        assert bravo.push_image(layout_tar(mine), name="bravo-img:1").reference == mine.reference
        # Alpha's token stores under the same name: into alpha's own names.
        alpha.push_image(layout_tar(hostile), name="bravo-img:1")

        logs, digest = _ran(bravo, "bravo", "bravo-img:1")
        assert "bravo's own files" in logs and "alpha" not in logs
        assert digest == mine.reference  # the record says which content it ran
        assert bravo.image("bravo-img:1").reference == mine.reference

        # Alpha's machines find alpha's own name first.
        logs, digest = _ran(alpha, "alpha", "bravo-img:1")
        assert "alpha's files" in logs and digest == hostile.reference


def test_an_app_may_not_run_or_read_another_apps_image_by_its_digest(
    cluster: Cluster, tokens: dict[str, str], tmp_path: Path
) -> None:
    secret = _image(tmp_path / "secret", "bravo's private build")
    with (
        cluster.client(token=tokens["bravo"]) as bravo,
        cluster.client(token=tokens["alpha"]) as alpha,
    ):
        bravo.push_image(layout_tar(secret), name="private:1")
        with pytest.raises(SouqError) as caught:
            alpha.create_machine("alpha", "mad", {"image": secret.reference, **NO_RESTART})
        assert caught.value.status == "image_not_found"
        assert "for app alpha" in caught.value.message
        for spelling in (f"private@{secret.reference}", f"anything:1@{secret.reference}"):
            with pytest.raises(SouqError) as named:
                alpha.create_machine("alpha", "mad", {"image": spelling, **NO_RESTART})
            assert named.value.status == "image_not_found", spelling
        with pytest.raises(SouqError) as read:
            alpha.image(secret.reference)
        assert read.value.status == "image_not_found"
        assert secret.reference not in {r.reference for r in alpha.images()}
        # Asking for bravo's names outright is refused.
        headers = {"Authorization": f"Bearer {tokens['alpha']}"}
        with httpx.Client(base_url=cluster.api_url, headers=headers, timeout=30) as http:
            r = http.get("/v1/images", params={"app": "bravo"})
            assert r.status_code == 403 and r.json()["status"] == "forbidden"
        # Bravo runs its own digest, and lists it.
        logs, digest = _ran(bravo, "bravo", secret.reference)
        assert "bravo's private build" in logs and digest == secret.reference
        assert secret.reference in {r.reference for r in bravo.images()}


def test_an_app_cannot_move_a_name_the_cluster_stored(
    cluster: Cluster, tokens: dict[str, str], tmp_path: Path
) -> None:
    base = _image(tmp_path / "base", "the operator's base")
    hostile = _image(tmp_path / "evil-base", "alpha's base")
    with (
        cluster.client() as operator,
        cluster.client(token=tokens["alpha"]) as alpha,
        cluster.client(token=tokens["bravo"]) as bravo,
    ):
        operator.push_image(layout_tar(base), name="base:1")  # every app's
        alpha.push_image(layout_tar(hostile), name="base:1")  # alpha's only
        logs, digest = _ran(bravo, "bravo", "base:1")
        assert "the operator's base" in logs and digest == base.reference
        assert operator.image("base:1").reference == base.reference
        # Every app may run an image the cluster stored, by its digest too.
        logs, _ = _ran(bravo, "bravo", base.reference)
        assert "the operator's base" in logs
        # An operator puts an image in one app's names with ?app=.
        operator.push_image(layout_tar(hostile), name="given:1", app="bravo")
        assert bravo.image("given:1").reference == hostile.reference
        with pytest.raises(SouqError):
            alpha.image("given:1")
        with pytest.raises(SouqError) as bad:
            operator.images(app="Not An App")
        assert bad.value.status == "invalid_input" and bad.value.details["field"] == "app"


async def _forget_access(cluster: Cluster, reference: str, owner: str) -> None:
    """The image's access key never written, as in a store written before access keys
    existed: its subject emptied in the stream, no delete marker left (a key deleted later
    still counts as access keys there, and keeps the image closed)."""
    nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
    try:
        key = f"acl.{reference.split(':', 1)[1]}.{owner}"
        await nc.jetstream().purge_stream(
            f"KV_{RECORDS_BUCKET}", subject=f"$KV.{RECORDS_BUCKET}.{key}"
        )
    finally:
        await nc.close()


def test_an_image_stored_before_access_keys_stays_the_clusters(
    cluster: Cluster, tokens: dict[str, str], tmp_path: Path
) -> None:
    old = _image(tmp_path / "old", "stored before access keys")
    with (
        cluster.client(token=tokens["bravo"]) as bravo,
        cluster.client(token=tokens["alpha"]) as alpha,
    ):
        bravo.push_image(layout_tar(old))
        with pytest.raises(SouqError):
            alpha.image(old.reference)
        asyncio.run(_forget_access(cluster, old.reference, "bravo"))
        logs, digest = _ran(alpha, "alpha", old.reference)
        assert "stored before access keys" in logs and digest == old.reference


def test_an_image_whose_access_key_was_deleted_stays_closed(
    cluster: Cluster, tokens: dict[str, str], tmp_path: Path
) -> None:
    """A deleted access key leaves its marker: the image had access keys, so it does not fall
    back to being the cluster's (that fallback is for images stored before access keys)."""
    img = _image(tmp_path / "img", "bravo's only")
    with (
        cluster.client(token=tokens["bravo"]) as bravo,
        cluster.client(token=tokens["alpha"]) as alpha,
    ):
        bravo.push_image(layout_tar(img))

        async def delete_access() -> None:
            nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
            try:
                store = await ImageStore.open(nc)
                await store.records.purge(f"acl.{img.reference.split(':', 1)[1]}.bravo")
            finally:
                await nc.close()

        asyncio.run(delete_access())
        with pytest.raises(SouqError):
            alpha.image(img.reference)
        with pytest.raises(SouqError):
            _ran(alpha, "alpha", img.reference)
