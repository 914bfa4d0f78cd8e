"""A create that names no region goes where the app is, and when that region is full, to the next
region with room: it is refused only when no region can take it (a burst of 1,000 such creates
once saw 112 refused while another region had room). A create that names its region stays there.
Real nats-server, ``souq agent`` and ``souq broker`` processes."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import httpx

from souq.testing import Cluster, auth_headers
from tests.clusters import ClusterSpec, cluster_fixture

SIZE = 0.01
PER_REGION = 5  # machines of SIZE that fit in each region's one worker


CLUSTER = ClusterSpec("spill", regions={"ams": 1, "lhr": 1}, cpus=SIZE * PER_REGION)


def create(api: httpx.Client, app: str, region: str | None = None) -> httpx.Response:
    body: dict[str, object] = {
        "skip_launch": True,
        "config": {"cmd": ["sleep", "600"], "guest": {"cpus": SIZE, "memory_mb": 1}},
    }
    if region is not None:
        body["region"] = region
    return api.post(f"/v1/apps/{app}/machines", json=body)


def test_a_create_without_a_region_goes_on_to_a_region_with_room(cluster: Cluster) -> None:
    app = "spill" + uuid.uuid4().hex[:6]
    with httpx.Client(base_url=cluster.api_url, headers=auth_headers(), timeout=30) as api:
        first = [create(api, app) for _ in range(PER_REGION)]
        assert all(r.status_code == 201 for r in first), [r.text for r in first]
        home = {r.json()["region"] for r in first}
        assert len(home) == 1, home  # where the app's machines are
        (home_region,) = home
        other = ({"ams", "lhr"} - home).pop()

        # The home region is full: a named create there is refused, and stays refused there.
        named = create(api, app, home_region)
        assert named.status_code == 409, named.text
        assert named.json()["status"] == "insufficient_capacity"

        spilled = create(api, app)
        assert spilled.status_code == 201, spilled.text
        assert spilled.json()["region"] == other
        why = spilled.json()["placement"]["region_chosen"]
        assert f"{home_region} had no room" in why and other in why, why

        rest = [create(api, app) for _ in range(PER_REGION - 1)]
        assert all(r.status_code == 201 and r.json()["region"] == other for r in rest)

        # Every region full: refused, naming what each region said.
        full = create(api, app)
        assert full.status_code == 409, full.text
        body = full.json()
        assert body["status"] == "insufficient_capacity"
        assert "no region can take it" in body["error"], body["error"]
        assert f"{home_region}:" in body["error"] and f"{other}:" in body["error"]
        assert "insufficient_cpu" in body["error"]

        listed = api.get(f"/v1/apps/{app}/machines").json()
        assert len(listed) == 2 * PER_REGION
        for m in listed:
            api.delete(f"/v1/apps/{app}/machines/{m['id']}", params={"force": "true"})


BURST = 400  # 0.01 cpus each: 4 cpus, in two regions of 2.1 cpus (0.2 to spare)


two_small_regions = cluster_fixture(
    ClusterSpec("spillburst", regions={"ams": 1, "lhr": 1}, cpus=2.1, memory_mb=65536)
)


def test_a_burst_without_a_region_fills_every_region_before_refusing(
    two_small_regions: Cluster,
) -> None:
    cluster = two_small_regions
    app = "spillb" + uuid.uuid4().hex[:6]

    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=BURST)
        async with httpx.AsyncClient(
            base_url=cluster.api_url, headers=auth_headers(), timeout=120, limits=limits
        ) as client:
            body = {
                "skip_launch": True,
                "config": {"cmd": ["sleep", "600"], "guest": {"cpus": SIZE, "memory_mb": 1}},
            }
            return await asyncio.gather(
                *(client.post(f"/v1/apps/{app}/machines", json=body) for _ in range(BURST))
            )

    answers = asyncio.run(burst())
    codes = Counter(r.status_code for r in answers)
    assert codes == {201: BURST}, (codes, [r.text for r in answers if r.status_code != 201][:2])
    regions = Counter(r.json()["region"] for r in answers)
    assert set(regions) == {"ams", "lhr"} and max(regions.values()) <= 210, regions
    ids = [r.json()["id"] for r in answers]

    async def destroy() -> None:
        async with httpx.AsyncClient(
            base_url=cluster.api_url, headers=auth_headers(), timeout=120
        ) as client:
            await asyncio.gather(
                *(
                    client.delete(f"/v1/apps/{app}/machines/{i}", params={"force": "true"})
                    for i in ids
                )
            )

    asyncio.run(destroy())
