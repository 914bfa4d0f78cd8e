"""Regions on separate NATS clusters joined by gateways (a NATS supercluster), for real: `mad`
and `syd` each run their own nats-server cluster; the broker knows only `mad`'s, the `syd`
agent only `syd`'s. A placement in `syd` crosses the gateway and back, what JetStream holds is
one store for both, and the broker's view of the remote region is whole."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import httpx
import nats
import pytest

from souq.auth.bus import credential, init_bus
from souq.auth.files import AuthDir
from souq.model import MachineState
from souq.natscluster import NatsCluster, supercluster
from souq.testing import AgentProcess, BrokerProcess, auth_headers, environment, wait_until

Regions = tuple[BrokerProcess, dict[str, AgentProcess], dict[str, NatsCluster], AuthDir]
SLEEPER = {"cmd": ["sleep", "600"], "guest": {"cpus": 0.05, "memory_mb": 16}}


@pytest.fixture(scope="module")
def regions(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[BrokerProcess, dict[str, AgentProcess]]]:
    root = tmp_path_factory.mktemp("gateways")
    auth = AuthDir.create(root / "auth")
    init_bus(auth)
    clusters: dict[str, NatsCluster] = supercluster(
        root / "nats", {"mad": 1, "syd": 1}, config=auth.nats_conf
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(environment(SOUQ_AUTH_DIR=str(auth.path), SOUQ_TOKEN=auth.admin()))
        for cluster in clusters.values():
            stack.callback(cluster.stop)
            cluster.launch()
        for cluster in clusters.values():
            cluster.wait_healthy()
        agents = {}
        for region, cluster in clusters.items():
            agent = AgentProcess(
                region=region, nats_url=cluster.url, data_dir=root / "workers" / region
            )
            stack.callback(agent.stop)
            agent.start()
            agents[region] = agent
        broker = BrokerProcess(nats_url=clusters["mad"].url, log_path=root / "broker.log")
        stack.callback(broker.stop)
        broker.start()
        yield broker, agents, clusters, auth


def test_a_placement_crosses_the_gateway(
    regions: Regions,
) -> None:
    broker, agents, _, _ = regions
    http = httpx.Client(base_url=broker.url, headers=auth_headers(), timeout=30)

    def both_up() -> bool:
        workers = http.get("/v1/workers").json()
        return {w["region"] for w in workers if w["state"] == "up"} == {"mad", "syd"}

    wait_until(both_up, timeout=30, message="both regions' workers to be up")
    r = http.post("/v1/apps/far/machines", json={"region": "syd", "config": SLEEPER})
    assert r.status_code == 201, r.text
    machine = r.json()
    assert machine["worker_id"] == agents["syd"].worker_id
    # Its events cross back: the broker sees it started, and can act on it over the gateway.
    path = f"/v1/apps/far/machines/{machine['id']}"

    def seen(state: MachineState) -> bool:
        return bool(http.get(path).json()["state"] == state.value)

    wait_until(lambda: seen(MachineState.STARTED), message="the remote machine started")
    assert http.post(f"{path}/stop").status_code == 200
    wait_until(lambda: seen(MachineState.STOPPED), message="the remote machine stopped")
    assert http.delete(path).status_code == 200


def test_jetstream_is_one_store_across_the_gateway(
    regions: Regions,
) -> None:
    broker, _, clusters, auth = regions
    http = httpx.Client(base_url=broker.url, headers=auth_headers(), timeout=30)
    r = http.post("/sched/submit", json={"name": "across", "command": ["true"]})
    assert r.status_code in (200, 201), r.text
    # An agent on the other cluster (they run batch jobs by default) pulls and runs it.
    done = wait_until(
        lambda: (
            (s := http.get("/sched/status/across").json())["state"] in ("succeeded", "failed") and s
        ),
        timeout=60,
        message="the job to finish",
    )
    assert done["state"] == "succeeded", done

    async def read_in_syd() -> dict[str, object]:
        """The job's record, read through `syd`'s own NATS cluster."""
        nc = await nats.connect(
            clusters["syd"].url.split(","), **credential(auth, "broker").options()
        )
        try:
            kv = await nc.jetstream().key_value("souq-jobs")
            entry = await kv.get("across")
            return dict(json.loads(entry.value or b"{}"))
        finally:
            await nc.close()

    assert asyncio.run(read_in_syd())["state"] == "succeeded"
