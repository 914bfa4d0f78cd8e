"""A price per region, with real parts: nats-server, two ``souq broker`` processes that work
the price out and publish it in JetStream, ``souq agent`` processes that preempt their own
spot machines when the published price passes their bids, and machines that really run.

The default rule (souq.market.prices): 0.01 an hour up to half full, then linearly to 0.1 at
full. The region here has 8 cpus (two workers of 4), and every machine takes one, so each one
moves the region's used fraction by 1/8."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest

from souq.market.prices import price_at
from souq.model.prices import SpotPriceRule
from souq.testing import Cluster, auth_headers, wait_until
from tests.integration.priority_harness import config

REGION = "spotr"
WORKERS, CPUS = 2, 4
RULE = SpotPriceRule()


def price_with(used_cpus: int, cpus: int = WORKERS * CPUS) -> float:
    return price_at(RULE, used_cpus / cpus)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("spot-prices")
    with Cluster(root, regions={REGION: WORKERS}, cpus=CPUS, memory_mb=4096, brokers=2) as c:
        yield c


def region_of(url: str, name: str = REGION) -> dict[str, Any]:
    answer = httpx.get(f"{url}/v1/regions", headers=auth_headers(), timeout=30)
    assert answer.status_code == 200, answer.text
    return next(r for r in answer.json() if r["name"] == name)


def published(cluster: Cluster, price: float) -> dict[str, Any] | None:
    """The region as the first broker shows it, once every broker shows ``price`` published."""
    seen = [region_of(b.url) for b in cluster.brokers]
    ok = all(r["spot_price"] == price and r["spot_price_source"] == "published" for r in seen)
    return seen[0] if ok else None


def wait_price(cluster: Cluster, price: float) -> dict[str, Any]:
    return wait_until(
        lambda: published(cluster, price), timeout=30, message=f"the spot price at {price}"
    )


def souq(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "souq", *args],
        env={**os.environ, "SOUQ_API": cluster.api_url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def run(cluster: Cluster, app: str, klass: str, price: float | None = None) -> str:
    client = cluster.client()
    made = client.create_machine(app, REGION, config(klass, price))
    client.wait(app, made.id, "started", timeout=30)
    return made.id


def destroy_all(cluster: Cluster, *apps: str) -> None:
    client = cluster.client()
    for app in apps:
        for machine in client.list_machines(app):
            client.destroy(app, machine.id, force=True)
    wait_price(cluster, price_with(0))


def events_of(cluster: Cluster, app: str, machine_id: str, kind: str) -> list[dict[str, Any]]:
    return [e.model_dump() for e in cluster.client().events(app, machine_id) if e.type == kind]


def test_the_price_rises_as_the_region_fills_in_the_api_and_the_cli(cluster: Cluster) -> None:
    app = "fill" + uuid.uuid4().hex[:6]
    wait_price(cluster, price_with(0))
    for _ in range(6):
        run(cluster, app, "standard")
    region = wait_price(cluster, price_with(6))
    assert region["spot_price"] == pytest.approx(0.055)  # 3/4 full: 1 + 9 * 0.25/0.5 floors
    assert region["spot_price_used"] == 0.75
    # Its recent history, oldest first, rose with it and ends at the price shown.
    history = [p["price"] for p in region["spot_price_history"]]
    assert history[-1] == region["spot_price"]
    # Strictly: two brokers publishing never took turns (an older view overwrites nothing).
    assert all(a < b for a, b in pairwise(history)), history

    metrics = httpx.get(f"{cluster.api_url}/metrics", headers=auth_headers(), timeout=30).text
    assert f'souq_spot_price{{region="{REGION}",source="published"}} 0.055' in metrics

    shown = souq(cluster, "regions", "--json")
    assert shown.returncode == 0, shown.stderr
    [listed] = [r for r in json.loads(shown.stdout) if r["name"] == REGION]
    assert listed["spot_price"] == region["spot_price"]
    table = souq(cluster, "regions")
    assert table.returncode == 0, table.stderr
    assert f"{region['spot_price']:g} (75% used)" in table.stdout
    destroy_all(cluster, app)


def test_a_spot_create_bidding_below_the_price_is_refused_naming_the_price(
    cluster: Cluster,
) -> None:
    app, spot = "fill" + uuid.uuid4().hex[:6], "bid" + uuid.uuid4().hex[:6]
    for _ in range(6):
        run(cluster, app, "standard")
    price = wait_price(cluster, price_with(6))["spot_price"]
    for broker in cluster.brokers:  # each broker refuses it, at the price they all publish
        answer = httpx.post(
            f"{broker.url}/v1/apps/{spot}/machines",
            json={"region": REGION, "config": config("spot", price=0.05)},
            headers=auth_headers(),
            timeout=30,
        )
        assert answer.status_code == 409, answer.text
        body = answer.json()
        assert body["status"] == "bid_below_price"
        assert body["spot_price"] == price and body["max_price"] == 0.05
        assert f"is {price:g} an hour" in body["error"] and "config.max_price" in body["error"]
    assert cluster.client().list_machines(spot) == []  # nothing was placed
    # The CLI exits 3 (no room at that price) and says the price.
    refused = souq(
        cluster,
        *("machine", "run", "--app", spot, "--region", REGION, "--priority-class", "spot"),
        *("--max-price", "0.05", "--", "sleep", "600"),
    )
    assert refused.returncode == 3, refused.stderr
    assert f"{price:g} an hour" in refused.stderr
    # A bid at the price it leaves (7 of 8 used) is placed, and not outbid by its own room.
    placed = run(cluster, spot, "spot", price=price_with(7))
    wait_price(cluster, price_with(7))
    assert cluster.client().get_machine(spot, placed).state == "started"
    destroy_all(cluster, app, spot)


def test_a_running_spot_machine_outbid_by_a_risen_price_is_preempted_with_its_event(
    cluster: Cluster,
) -> None:
    app, spot = "fill" + uuid.uuid4().hex[:6], "bid" + uuid.uuid4().hex[:6]
    client = cluster.client()
    wait_price(cluster, price_with(0))
    bidder = run(cluster, spot, "spot", price=0.05)
    unlimited = run(cluster, spot, "spot")  # no max_price: never outbid
    for _ in range(3):  # 5 of 8 used: 0.0325, below its bid
        run(cluster, app, "standard")
    wait_price(cluster, price_with(5))
    assert client.get_machine(spot, bidder).state == "started"

    run(cluster, app, "standard")  # 6 of 8: 0.055, above its bid of 0.05
    stopped = client.wait(spot, bidder, "stopped", timeout=30)
    [event] = events_of(cluster, spot, bidder, "preempted")
    assert event["source"] == "agent"
    assert f"the spot price in region {REGION} rose to {price_with(6):g} an hour" in str(
        event["message"]
    )
    assert "above its max_price 0.05" in str(event["message"])
    assert stopped.state == "stopped"
    # Its room given back, the price falls again; the machine without a limit runs on.
    wait_price(cluster, price_with(5))
    assert client.get_machine(spot, unlimited).state == "started"
    assert not events_of(cluster, spot, unlimited, "preempted")
    # Started again while the price is above its bid, it is refused as its create would be.
    run(cluster, app, "standard")
    wait_price(cluster, price_with(6))
    again = httpx.post(
        f"{cluster.api_url}/v1/apps/{spot}/machines/{bidder}/start",
        headers=auth_headers(),
        timeout=30,
    )
    assert again.status_code == 409, again.text
    assert again.json()["status"] == "bid_below_price"
    destroy_all(cluster, app, spot)


def test_a_notice_period_tells_the_machine_before_its_stop(tmp_path: Path) -> None:
    with Cluster(tmp_path, regions={"note": 0}) as c:
        c.add_agent("note", cpus=2, extra_args=["--spot-notice", "1"])
        c.wait_for_workers()
        client = c.client()
        spot = client.create_machine("batch", "note", config("spot", price=0.05))
        client.wait("batch", spot.id, "started", timeout=30)
        wait_until(
            lambda: region_of(c.api_url, "note")["spot_price_source"] == "published",
            timeout=30,
            message="a published price",
        )
        client.create_machine("web", "note", config("standard"))  # full: 0.1, above 0.05
        client.wait("batch", spot.id, "stopped", timeout=30)
        [notice] = events_of(c, "batch", spot.id, "preempt_notice")
        [preempted] = events_of(c, "batch", spot.id, "preempted")
        assert "it stops in 1 s" in str(notice["message"])
        assert notice["status"] == "started"  # it ran on through its notice
        assert preempted["timestamp"] >= notice["timestamp"] + 1000
        assert "after 1 s of notice" in str(preempted["message"])
