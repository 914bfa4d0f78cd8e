"""A batch larger than one NATS message can answer, on hollow workers (`souq fleet`) behind a
real broker and nats-server: every machine a worker made reaches the answer, and a batch that
fails leaves no machine holding capacity that the user cannot see."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from souq.auth.bus import init_bus
from souq.auth.files import AuthDir
from souq.client.api import SouqClient
from souq.natsserver import NatsServer
from souq.testing import BrokerProcess, FleetProcess, auth_headers, environment, wait_until

WORKERS = 2
CPUS = 64  # each hollow worker holds 640 machines of 0.1 cpu


@dataclass
class Fleet:
    api: str
    client: SouqClient


@pytest.fixture
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A fresh fleet for each test: two hollow workers of 640 slots each, one broker."""
    root: Path = tmp_path_factory.mktemp("batch")
    auth = AuthDir.create(root / "auth")
    init_bus(auth)
    with (
        environment(SOUQ_AUTH_DIR=str(auth.path), SOUQ_TOKEN=auth.admin()),
        NatsServer(store_dir=root / "nats", config=auth.nats_conf) as nats,
    ):
        hollow = FleetProcess(
            nats_url=nats.url,
            region="hol",
            workers=WORKERS,
            cpus=CPUS,
            memory_mb=CPUS * 1024,
            log_path=root / "fleet.log",
        )
        broker = BrokerProcess(nats_url=nats.url, log_path=root / "broker.log")
        try:
            hollow.start()
            broker.start()
            client = SouqClient(broker.url, token=auth.admin(), timeout=120)
            wait_until(
                lambda: sum(w.state.value == "up" for w in client.workers()) == WORKERS,
                timeout=30,
                message="every hollow worker to be up",
            )
            yield Fleet(broker.url, client)
        finally:
            broker.stop()
            hollow.stop()


def _batch(fleet: Fleet, app: str, count: int, **extra: object) -> httpx.Response:
    body = {
        "region": "hol",
        "count": count,
        "skip_launch": True,
        # A config of some size, as a real one is (its env echoed in every machine's record).
        "config": {
            "cmd": ["serve"],
            "env": {f"VAR_{i}": "x" * 40 for i in range(20)},
            "guest": {"cpus": 0.1, "memory_mb": 64},
        },
        **extra,
    }
    return httpx.post(
        f"{fleet.api}/v1/apps/{app}/machines/batch",
        json=body,
        headers=auth_headers(),
        timeout=300,
    )


def test_a_batch_of_a_thousand_answers_every_machine_it_made(fleet: Fleet) -> None:
    r = _batch(fleet, "big", 1000)
    assert r.status_code == 201, r.text[:2000]
    result = r.json()
    assert result["placed"] == 1000 and len(result["machines"]) == 1000
    assert len({m["id"] for m in result["machines"]}) == 1000
    made = {m["id"] for m in result["machines"]}
    # The list is the cluster view's (fed by the workers' events) or, before the view is whole,
    # every worker's answer: either way every machine made, once its events have arrived.
    wait_until(
        lambda: {m.id for m in fleet.client.list_machines("big")} == made,
        timeout=60,
        message="the list to hold every machine of the batch",
    )


def test_a_batch_that_falls_short_leaves_nothing_running(fleet: Fleet) -> None:
    assert _batch(fleet, "first", 400).status_code == 201
    # More than the fleet has left (1,280 slots, 400 taken): all or nothing.
    r = _batch(fleet, "short", 1000)
    assert r.status_code == 409, r.text[:2000]
    assert r.json()["status"] == "insufficient_capacity"

    def gone() -> bool:
        return all(m.state.value == "destroyed" for m in fleet.client.list_machines("short"))

    wait_until(gone, timeout=60, message="the machines of the failed batch to be destroyed")
