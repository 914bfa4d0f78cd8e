"""Souq on a NATS cluster of three real nats-server nodes: every daemon is given all three URLs
(``--nats a,b,c``), and any one node may die, by kill -9, while the cluster is under load.

Each node dies in turn (so that whichever one the broker, an agent or the proxy is connected to
dies at some point): creates keep succeeding (a create cut short answers 503 ``unavailable``
and, retried with its ``Idempotency-Key``, makes no second machine), every worker stays or
comes back up, the proxy keeps answering, and what JetStream holds (jobs, releases) stays
readable, each stream keeping three copies.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import nats
import nats.errors
import pytest

from souq.bus.jetstream import key_value, replicas_for
from souq.model import MachineState
from souq.natscluster import NatsCluster
from souq.testing import Cluster, ProxyProcess, auth_headers, wait_until
from tests.clusters import ClusterSpec
from tests.integration.services_harness import app_name, edge_proxy
from tests.integration.services_harness import echo_config as config
from tests.integration.test_nats_outage import agent_rows

APP = "hanodes"
SLEEPER = {"cmd": ["sleep", "3600"], "guest": {"cpus": 0.01, "memory_mb": 16}}
PACE_S = 0.3  # between two creates: load, not a flood of processes on a 2-core machine
CREATORS = 3  # creates in flight at once


CLUSTER = ClusterSpec("natscluster", regions={"mad": 2}, nats_nodes=3)


@pytest.fixture(scope="module")
def proxy(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with edge_proxy(cluster, tmp_path_factory) as p:
        yield p


def nodes(cluster: Cluster) -> NatsCluster:
    assert isinstance(cluster.nats, NatsCluster)
    return cluster.nats


def broker_nats(cluster: Cluster) -> str:
    """HOST:PORT of the NATS node the broker is connected to."""
    r = httpx.get(f"{cluster.api_url}/healthz", headers=auth_headers(), timeout=10)
    return str(r.json()["nats_server"])


def through_proxy(proxy: ProxyProcess, app: str) -> dict[str, object] | None:
    """The app's answer through the proxy (None: not a 200)."""
    try:
        r = httpx.get(proxy.url, headers={"Host": f"{app}.localhost"}, timeout=15)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


def create(api: str, key: str, app: str = APP) -> tuple[int, dict[str, object]]:
    """One create with an idempotency key: (status, body); a connection error is (0, {})."""
    body = {"region": "mad", "config": SLEEPER}
    try:
        r = httpx.post(
            f"{api}/v1/apps/{app}/machines",
            json=body,
            headers={**auth_headers(), "Idempotency-Key": key},
            timeout=30,
        )
    except httpx.HTTPError:
        return 0, {}
    return r.status_code, r.json()


class Creator(threading.Thread):
    """Creates machines one after another, each retried with its key until it is made, and
    records every answer that was not a success."""

    def __init__(self, api: str, prefix: str) -> None:
        super().__init__(daemon=True)
        self.api = api
        self.stop = threading.Event()
        self.made: dict[str, str] = {}  # key -> machine id
        self.failures: list[tuple[int, object]] = []
        self._keys = (f"{prefix}{i}" for i in itertools.count())

    def run(self) -> None:
        while not self.stop.is_set():
            key = next(self._keys)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                status, body = create(self.api, key)
                if status in (200, 201):
                    self.made[key] = str(body["id"])
                    break
                self.failures.append((status, body.get("status")))
                self.stop.wait(PACE_S)
            self.stop.wait(PACE_S)


def test_streams_keep_three_copies(cluster: Cluster) -> None:
    async def check() -> int:
        nc = await nats.connect(nodes(cluster).url.split(","), **cluster.nats_options())
        try:
            return replicas_for(nc)
        finally:
            await nc.close()

    assert asyncio.run(check()) == 3
    r = httpx.post(
        f"{cluster.api_url}/sched/submit",
        json={"name": "three-copies", "command": ["true"]},
        headers=auth_headers(),
        timeout=30,
    )
    assert r.status_code in (200, 201), r.text

    async def copies() -> int:
        nc = await nats.connect(nodes(cluster).url.split(","), **cluster.nats_options())
        try:
            info = await nc.jetstream().stream_info("KV_souq-jobs")
            return info.config.num_replicas or 1
        finally:
            await nc.close()

    assert asyncio.run(copies()) == 3


def test_a_stream_made_while_a_node_is_down_keeps_three_copies(tmp_path: Path) -> None:
    """The node a client is connected to dies; after the client moves to another (whose list
    of nodes may already have lost the dead one: tests/unit/test_nats_replicas.py), a stream
    made now keeps three copies, as the cluster has."""
    nats_cluster = NatsCluster(tmp_path / "nats", 3)
    nats_cluster.start()

    async def made_after_a_loss() -> int:
        first = nats_cluster.nodes[0]
        nc = await nats.connect([first.url], reconnect_time_wait=0.05)
        try:
            assert first.process is not None
            first.process.kill()
            first.process.wait()
            deadline = time.monotonic() + 30
            while not (moved := nc.connected_url) or moved.port == first.port:
                assert time.monotonic() < deadline, "the client never moved to another node"
                await asyncio.sleep(0.05)
            while True:  # until JetStream has a leader again (a few seconds at most)
                try:
                    kv = await key_value(nc.jetstream(), "made-after-a-loss", "a test's bucket")
                    info = await nc.jetstream().stream_info(kv._stream)
                    return info.config.num_replicas or 1
                except nats.errors.TimeoutError:
                    assert time.monotonic() < deadline, "JetStream never answered again"
        finally:
            await nc.close()

    try:
        copies = asyncio.run(made_after_a_loss())
    finally:
        nats_cluster.stop()
    assert copies == 3


def test_any_node_may_die_under_load(cluster: Cluster, proxy: ProxyProcess) -> None:
    client = cluster.client()
    served = app_name("n")
    web = client.create_machine(served, "mad", config())
    wait_until(lambda: through_proxy(proxy, served), message="the proxy to route the app")
    creators = [Creator(cluster.api_url, f"c{i}-") for i in range(CREATORS)]
    for creator in creators:
        creator.start()

    def made() -> int:
        return sum(len(c.made) for c in creators)

    def made_at_least(count: int) -> bool:
        return made() >= count

    # (was, is): the broker's NATS node, each time the one it was connected to died
    moved: list[tuple[str, str]] = []
    try:
        for node in nodes(cluster).nodes:
            wait_until(partial(made_at_least, made() + 2), timeout=60, message="creates")
            was = broker_nats(cluster)
            node.kill()  # kill -9: its clients' connections drop without a word
            # Creates go on through the other two nodes.
            wait_until(
                partial(made_at_least, made() + 3),
                timeout=60,
                message="creates to succeed with a node dead",
            )
            if node.url.endswith(was):
                moved.append((was, broker_nats(cluster)))
            cluster.wait_for_workers(timeout=60)
            answer = wait_until(
                lambda: through_proxy(proxy, served),
                timeout=60,
                message="the proxy to answer with a node dead",
            )
            assert answer is not None and answer["machine_id"] == web.id
            node.start()
            nodes(cluster).wait_healthy(timeout=60)
    finally:
        for creator in creators:
            creator.stop.set()
        for creator in creators:
            creator.join(timeout=90)
    assert not any(c.is_alive() for c in creators)
    # The broker's own node died (once at least: it may move to one that dies later), and each
    # time it went on through another.
    assert moved and all(now not in ("", was) for was, now in moved), moved
    failures = [f for c in creators for f in c.failures]
    keys = {k: v for c in creators for k, v in c.made.items()}
    # Every failure was a clear one: 503 unavailable (or the connection cut while the broker
    # itself lost its node), never a 500 and never a second machine for a key.
    assert all(status in (0, 503) for status, _ in failures), failures
    assert {code for status, code in failures if status == 503} <= {"unavailable"}
    listed = client.list_machines(APP)
    ids = [m.id for m in listed]
    assert len(ids) == len(set(ids))
    assert sorted(ids) == sorted(keys.values())
    assert all(m.state == MachineState.STARTED for m in listed)
    # Nothing was lost: each agent's own state file holds every machine it was given, started.
    rows = {a.worker_id: agent_rows(a) for a in cluster.agents}
    for m in listed:
        assert rows[m.worker_id][m.id].state == "started"
    client.destroy(served, web.id, force=True)
