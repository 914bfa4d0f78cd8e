"""An app's secrets driven with the requests Fly's Go client builds: ``{"values": {...}}``
(null unsets), one secret by name, a delete answering the new ``version``, listings as
``{"secrets": [...], "version": N}`` — and never a value shown."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from souq.testing import Cluster
from tests.clusters import ClusterSpec
from tests.integration.services_harness import app_name, fly_client

CLUSTER = ClusterSpec("flysecrets", regions={"mad": 1})


@pytest.fixture(scope="module")
def fly(cluster: Cluster) -> Iterator[httpx.Client]:
    with fly_client(cluster, timeout=30) as c:
        yield c


def test_secrets_in_flys_shapes(fly: httpx.Client) -> None:
    app = app_name("s")
    r = fly.post(f"/apps/{app}/secrets", json={"values": {"A": "1", "B": "2"}})
    assert r.status_code == 200, r.text
    first = r.json()["version"]
    assert isinstance(first, int) and first > 0
    assert [s["name"] for s in r.json()["secrets"]] == ["A", "B"]
    assert all("value" not in s and s["updated_at"] for s in r.json()["secrets"])

    one = fly.post(f"/apps/{app}/secrets/C", json={"value": "3"})
    assert one.status_code == 200, one.text
    assert one.json()["name"] == "C" and one.json()["version"] > first
    assert fly.get(f"/apps/{app}/secrets/C").json()["digest"] == one.json()["digest"]

    gone = fly.delete(f"/apps/{app}/secrets/C")
    assert gone.status_code == 200 and gone.json()["version"] > one.json()["version"]
    assert fly.get(f"/apps/{app}/secrets/C").status_code == 404

    r = fly.post(f"/apps/{app}/secrets", json={"values": {"A": None, "D": "4"}})
    assert [s["name"] for s in r.json()["secrets"]] == ["B", "D"]
    listed = fly.get(f"/apps/{app}/secrets", params={"version": str(r.json()["version"])})
    assert [s["name"] for s in listed.json()["secrets"]] == ["B", "D"]
    later = fly.get(f"/apps/{app}/secrets", params={"version": str(r.json()["version"] + 99)})
    assert later.status_code == 404

    shown = fly.get(f"/apps/{app}/secrets", params={"show_secrets": "true"})
    assert shown.status_code == 422 and "never shown" in shown.json()["error"]
    bad = fly.post(f"/apps/{app}/secrets", json={"values": {"1BAD": "x"}})
    assert bad.status_code == 422 and "1BAD" in bad.json()["error"]
    # Souq's own body still works, and answers Souq's list.
    souq = fly.post(f"/apps/{app}/secrets", json={"E": "5"})
    assert souq.status_code == 200 and [s["name"] for s in souq.json()] == ["E"]
