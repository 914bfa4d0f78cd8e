"""A name names one image: ``souq image list`` shows it on the image it names now, never on
one a later image of the same name took it over from (real nats-server, broker and CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from souq.testing import Cluster
from tests.clusters import ClusterSpec
from tests.integration.images_harness import souq

CLUSTER = ClusterSpec("image-names", regions={"mad": 1})


def build(cluster: Cluster, root: Path, content: str, name: str) -> str:
    root.mkdir(parents=True)
    (root / "file").write_text(content)
    run = souq(cluster, "image", "build", str(root), "--name", name, "--cmd", "true")
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


@pytest.mark.parametrize("name", ["docker.io/library/busybox:latest", "web:v1"])
def test_a_replaced_image_is_listed_without_the_name(
    cluster: Cluster, tmp_path: Path, name: str
) -> None:
    first = build(cluster, tmp_path / "one", "one", name)
    second = build(cluster, tmp_path / "two", "two", name)
    assert first != second

    listed = souq(cluster, "image", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    names = {r["reference"]: r["name"] for r in json.loads(listed.stdout)}
    assert names[second] == name
    assert names[first] is None  # still stored, by its reference: the name is not its own

    table = souq(cluster, "image", "list")
    assert table.returncode == 0, table.stderr
    assert [line for line in table.stdout.splitlines() if f" {name} " in line] == [
        line for line in table.stdout.splitlines() if line.startswith(second[:19])
    ]
