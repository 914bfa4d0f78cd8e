"""Peers one minor version apart interoperate: unknown fields are dropped, unknown verbs get a
typed error. Each side is real (an agent, or the broker's liveness table and WorkerClient) on a
real nats-server; the newer peer is played with hand-written JSON, as it would travel."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from souq.bus import subjects
from souq.bus.codec import ok_reply, unwrap
from souq.bus.nats import connect
from souq.clock import SystemClock
from souq.errors import InvalidInput, UnknownVerb
from souq.model import MachineRef, MachineState
from souq.protocol import PROTOCOL_MINOR, Verb, WorkerClient
from souq.protocol import verbs as v
from souq.view.liveness import Liveness
from tests.integration.agent_harness import APP, eventually, running_agent


def test_an_agent_takes_a_claim_from_a_newer_broker(nats_url: str, tmp_path: Path) -> None:
    """A claim with fields this agent has never heard of, at the top and deep in the config."""

    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            claim = {
                "request_id": "r-newer",
                "body_hash": "h",
                "app": APP,
                "region": "mad",
                "lease_ttl_s": 30,  # a field of a later version
                "config": {
                    "cmd": ["sleep", "60"],
                    "guest": {"cpus": 0.5, "memory_mb": 64, "kernel_args": "quiet"},
                    "services": [{"internal_port": 8080}],
                },
            }
            data = await h.bus.request(
                subjects.worker(h.worker_id, "claim"), json.dumps(claim).encode(), 10
            )
            client = WorkerClient(h.bus)
            machine = await client.call(
                h.worker_id, v.GET, MachineRef(app=APP, machine_id=_id(data)), timeout=10
            )
            assert machine.state in (MachineState.STARTING, MachineState.STARTED)
            assert (machine.config.guest.cpus, machine.config.cmd) == (0.5, ["sleep", "60"])

    asyncio.run(body())


def test_an_unknown_verb_gets_a_typed_error_naming_it(nats_url: str, tmp_path: Path) -> None:
    teleport = Verb("teleport", MachineRef, MachineRef, since=PROTOCOL_MINOR + 1)

    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            client = WorkerClient(h.bus)
            with pytest.raises(UnknownVerb) as caught:
                await client.call(
                    h.worker_id, teleport, MachineRef(app=APP, machine_id="m1"), timeout=10
                )
            err = caught.value
            assert (err.status, err.http_status) == ("unknown_verb", 501)
            assert "teleport" in err.message and f"1.{PROTOCOL_MINOR}" in err.message
            assert err.details["verb"] == "teleport"
            # The agent goes on answering what it knows.
            with pytest.raises(InvalidInput, match="machine_id"):
                unwrap(
                    await h.bus.request(subjects.worker(h.worker_id, "get"), b'{"app": "x"}', 10)
                )

    asyncio.run(body())


def test_a_malformed_request_names_the_field(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            data = await h.bus.request(
                subjects.worker(h.worker_id, "stop"),
                json.dumps({"app": APP, "machine_id": "m1", "timeout_s": "soon"}).encode(),
                10,
            )
            error = json.loads(data)["error"]
            assert error["status"] == "invalid_input"
            assert error["field"] == "timeout_s"
            assert "stop" in error["error"]

    asyncio.run(body())


def test_a_broker_reads_a_newer_agents_heartbeats_and_records(nats_url: str) -> None:
    """A newer agent's heartbeat (new keys in the worker and the beat) still counts, and a
    machine record with new keys deep in its config still reads."""
    beat = {
        "seq": 1,
        "interval_s": 1.0,
        "protocol": PROTOCOL_MINOR + 1,
        "zone": "mad-1a",
        "worker": {
            "id": "w-newer",
            "region": "mad",
            "capacity": {"cpus": 4, "memory_mb": 4096, "nvme_gb": 10},
            "allocated": {"cpus": 0, "memory_mb": 0},
            "images": ["sha256:abc"],
        },
    }
    record = {
        "id": "m1",
        "name": "m1",
        "app": APP,
        "region": "mad",
        "worker_id": "w-newer",
        "state": "started",
        "instance_id": "i-1",
        "config": {
            "cmd": ["x"],
            "guest": {"cpus": 1, "memory_mb": 64, "cpu_kind": "shared"},
            "image": "sha256:abc",
        },
        "created_at": "2026-11-25T00:00:00.000Z",
        "updated_at": "2026-11-25T00:00:00.000Z",
    }

    async def body() -> None:
        broker_bus = await connect(nats_url, name="older-broker")
        agent_bus = await connect(nats_url, name="newer-agent")
        liveness = Liveness(broker_bus, SystemClock())
        try:
            await liveness.start()

            async def get(subject: str, data: bytes) -> bytes:
                return ok_reply(record)

            await agent_bus.subscribe(subjects.worker("w-newer", "get"), get)
            await agent_bus.flush()
            await agent_bus.publish(subjects.heartbeat("mad", "w-newer"), json.dumps(beat).encode())
            info = await eventually(lambda: liveness.info("w-newer"), message="the heartbeat")
            assert info.capacity.cpus == 4
            machine = await WorkerClient(broker_bus).call(
                "w-newer", v.GET, MachineRef(app=APP, machine_id="m1"), timeout=5
            )
            assert (machine.id, machine.config.guest.memory_mb) == ("m1", 64)
        finally:
            await liveness.close()
            await agent_bus.close()
            await broker_bus.close()

    asyncio.run(body())


def _id(reply: bytes) -> str:
    envelope = json.loads(reply)
    assert envelope["ok"], envelope
    return str(envelope["result"]["id"])
