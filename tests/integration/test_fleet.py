"""The hollow fleet: ``souq fleet`` workers speak the real protocol over real NATS to a real
``souq broker``; past ``sample_above`` workers the broker samples."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from souq.auth.bus import init_bus
from souq.auth.files import AuthDir
from souq.client.api import SouqClient
from souq.natsserver import NatsServer
from souq.testing import BrokerProcess, FleetProcess, auth_headers, environment, wait_until

WORKERS = 100


@pytest.fixture(scope="module")
def fleet_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("fleet")
    auth = AuthDir.create(root / "auth")
    init_bus(auth)  # the fleet joins a locked-down bus with its own user
    with (
        environment(SOUQ_AUTH_DIR=str(auth.path), SOUQ_TOKEN=auth.admin()),
        NatsServer(store_dir=root / "nats", config=auth.nats_conf) as nats,
    ):
        fleet = FleetProcess(
            nats_url=nats.url,
            region="hol",
            workers=WORKERS,
            cpus=2,
            memory_mb=1024,
            log_path=root / "fleet.log",
        )
        broker = BrokerProcess(nats_url=nats.url, log_path=root / "broker.log")
        try:
            fleet.start()
            broker.start()
            client = SouqClient(broker.url, token=auth.admin())
            wait_until(
                lambda: sum(w.state.value == "up" for w in client.workers()) == WORKERS,
                timeout=30,
                message="every hollow worker to be up",
            )
            yield broker.url
        finally:
            broker.stop()
            fleet.stop()


def test_hollow_workers_run_the_machine_life_cycle(fleet_api: str) -> None:
    client = SouqClient(fleet_api)
    workers = client.workers()
    assert len(workers) == WORKERS
    assert {(w.region, w.capacity.cpus, w.capacity.memory_mb) for w in workers} == {
        ("hol", 2, 1024)
    }
    machine = client.create_machine(
        "hollow", "hol", {"cmd": ["serve"], "guest": {"cpus": 1, "memory_mb": 64}}
    )
    assert machine.state.value == "started"
    record = machine.placement
    assert record is not None and record.sampled is not None
    assert (record.sampled.asked, record.sampled.of) == (8, WORKERS)  # max(8, d x 1)
    client.stop("hollow", machine.id)
    assert client.wait("hollow", machine.id, "stopped", timeout=10).state.value == "stopped"
    client.start("hollow", machine.id)
    client.wait("hollow", machine.id, "started", timeout=10)
    client.destroy("hollow", machine.id, force=True)
    assert client.list_machines("hollow") == []


def test_a_batch_lands_on_a_sample_of_the_fleet(fleet_api: str) -> None:
    body = {
        "region": "hol",
        "count": 40,
        "skip_launch": True,
        "config": {"cmd": ["serve"], "guest": {"cpus": 0.5, "memory_mb": 64}},
    }
    r = httpx.post(
        f"{fleet_api}/v1/apps/batch/machines/batch", json=body, timeout=30, headers=auth_headers()
    )
    assert r.status_code == 201, r.text
    result = r.json()
    assert result["placed"] == 40
    record = result["placement"]
    assert record["sampled"]["asked"] == 20  # d x m / slots: 2 x 40 / (2 cpus / 0.5)
    assert sum(record["assignments"].values()) == 40
    assert all(n <= 4 for n in record["assignments"].values())  # 2 cpus / 0.5
    client = SouqClient(fleet_api)
    assert len(client.list_machines("batch")) == 40
    keyed = httpx.post(
        f"{fleet_api}/v1/apps/batch/machines/batch",
        json=body,
        headers={"Idempotency-Key": "k", **auth_headers()},
        timeout=30,
    )
    assert keyed.status_code == 422
    assert keyed.json()["status"] == "invalid_input"
