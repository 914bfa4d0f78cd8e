"""A worker's NATS credential used as an attacker would: an agent's nkey, from the cluster's
auth directory, on the real bus of a real cluster (two agents, a broker). Whatever it tries, it
commands no other worker, changes no shared consumer, and a record it spoils in a shared bucket
breaks nobody's listing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig

from souq.auth.bus import credential
from souq.bus import subjects
from souq.bus.permissions import (
    JOBS_BUCKET,
    JOBS_READY,
    JOBS_RUNNERS,
    agent_user,
)
from souq.model import MachineState
from souq.testing import Cluster, auth_headers, wait_until
from tests.clusters import ClusterSpec

SETTLE_S = 1.0  # for a message that must not arrive: long enough for the bus to deliver it


def _queue_made(c: Cluster) -> None:
    # The queue's bucket and stream exist once a broker served a /sched route.
    r = httpx.get(f"{c.api_url}/sched/list", headers=auth_headers(), timeout=30)
    assert r.status_code == 200, r.text


CLUSTER = ClusterSpec("tenancy-bus", regions={"mad": 2}, ready=_queue_made)


@asynccontextmanager
async def as_agent(cluster: Cluster, worker_id: str) -> AsyncIterator[Client]:
    """A connection with ``worker_id``'s agent credential, as read from the auth directory."""
    assert cluster.auth is not None
    cred = credential(cluster.auth, agent_user(worker_id))
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(cluster.nats.url, error_cb=on_error, **cred.options())
    try:
        yield nc
    finally:
        await nc.close()


def victim(cluster: Cluster) -> tuple[str, str, str]:
    """(app, machine id, the attacker's worker id): a machine on one worker, the other's
    credential."""
    client = cluster.client()
    app = "v" + uuid.uuid4().hex[:8]
    m = client.create_machine(
        app, "mad", {"cmd": ["sleep", "600"], "guest": {"cpus": 0.1, "memory_mb": 32}}
    )
    attacker = next(a.worker_id for a in cluster.agents if a.worker_id != m.worker_id)
    return app, m.id, attacker


def alive(cluster: Cluster, app: str, machine_id: str) -> bool:
    return cluster.client().get_machine(app, machine_id).state is MachineState.STARTED


async def push_into(nc: Client, stream: str, subject: str, deliver: str) -> None:
    """Have a push consumer of ``stream`` deliver ``subject``'s records to ``deliver`` (a
    refusal swallowed: the attack is judged by its effect)."""
    js = nc.jetstream()
    config = ConsumerConfig(
        deliver_subject=deliver,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=AckPolicy.NONE,
        filter_subject=subject,
    )
    with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError):
        await js.add_consumer(stream, config, timeout=2)


def test_a_push_consumer_delivers_no_command_to_another_worker(cluster: Cluster) -> None:
    app, machine_id, attacker = victim(cluster)
    victim_worker = cluster.client().get_machine(app, machine_id).worker_id
    command = json.dumps({"app": app, "machine_id": machine_id, "force": True}).encode()

    async def attack() -> None:
        async with as_agent(cluster, attacker) as nc:
            key = f"x{uuid.uuid4().hex[:8]}"
            subject = f"$KV.{JOBS_BUCKET}.{key}"
            await nc.jetstream().publish(subject, command)  # agents write the jobs bucket
            for verb_subject in (
                f"souq.worker.{victim_worker}.destroy",
                "souq.all.destroy",
            ):
                await push_into(nc, f"KV_{JOBS_BUCKET}", subject, verb_subject)
            await asyncio.sleep(SETTLE_S)

    asyncio.run(attack())
    assert alive(cluster, app, machine_id), "another worker's credential destroyed the machine"


def test_a_worker_acts_on_nothing_a_push_consumer_delivers(cluster: Cluster) -> None:
    """The server checks no deliver subject: an agent's consumer on the jobs bucket (which it
    may write) delivers a hundred records into ``souq.discover``, which every worker answers with
    a heartbeat, and into the region's offers and the broadcast list. A worker that acted on
    them would beat a hundred times in a second; it beats on its interval only."""
    _, _, attacker = victim(cluster)
    watched = next(a.worker_id for a in cluster.agents if a.worker_id != attacker)
    n = 100

    async def attack() -> int:
        beats: list[int] = []

        async def on_beat(msg: Msg) -> None:
            beats.append(json.loads(msg.data)["seq"])

        broker = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
        try:
            await broker.subscribe(f"souq.hb.*.{watched}", cb=on_beat)
            async with as_agent(cluster, attacker) as nc:
                js = nc.jetstream()
                prefix = f"x{uuid.uuid4().hex[:8]}"
                for i in range(n):
                    await js.publish(f"$KV.{JOBS_BUCKET}.{prefix}.{i}", b"{}")
                for deliver in ("souq.discover", "souq.offers.mad", "souq.all.list"):
                    # created: the server names no deliver subject it refuses
                    await js.add_consumer(
                        f"KV_{JOBS_BUCKET}",
                        ConsumerConfig(
                            deliver_subject=deliver,
                            ack_policy=AckPolicy.NONE,
                            filter_subject=f"$KV.{JOBS_BUCKET}.{prefix}.>",
                        ),
                        timeout=5,
                    )
                await asyncio.sleep(SETTLE_S)
        finally:
            await broker.close()
        return len(beats)

    beats = asyncio.run(attack())
    assert beats < n // 4, f"the worker heartbeat {beats} times on {n} delivered discovers"


def test_an_agent_cannot_change_or_replace_the_shared_job_consumer(cluster: Cluster) -> None:
    _, _, attacker = victim(cluster)

    async def attack() -> tuple[int, str | None]:
        async with as_agent(cluster, attacker) as nc:
            js = nc.jetstream()
            with pytest.raises((nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError)):
                await js.add_consumer(
                    JOBS_READY,
                    ConsumerConfig(
                        name=JOBS_RUNNERS,
                        durable_name=JOBS_RUNNERS,
                        filter_subject=subjects.JOBS_READY,
                        ack_policy=AckPolicy.EXPLICIT,
                        ack_wait=1.0,
                        max_ack_pending=1,
                        description="attacker",
                    ),
                    timeout=2,
                )
        broker = cluster.nats_options("broker")
        nc = await nats.connect(cluster.nats.url, **broker)
        try:
            info = await nc.jetstream().consumer_info(JOBS_READY, JOBS_RUNNERS)
            return info.config.max_ack_pending or 0, info.config.description
        finally:
            await nc.close()

    max_ack_pending, description = asyncio.run(attack())
    assert description != "attacker" and max_ack_pending != 1


@pytest.mark.parametrize("spoiled", [b"{}", b"not json", b'{"name": 3}'])
def test_a_spoiled_job_record_breaks_no_listing(cluster: Cluster, spoiled: bytes) -> None:
    _, _, attacker = victim(cluster)
    key = f"spoiled-{uuid.uuid4().hex[:8]}"

    async def spoil() -> None:
        async with as_agent(cluster, attacker) as nc:
            await nc.jetstream().publish(f"$KV.{JOBS_BUCKET}.{key}", spoiled)

    asyncio.run(spoil())
    try:
        for route in ("/sched/list", "/sched/jobs", "/sched/cancellations"):
            r = httpx.get(f"{cluster.api_url}{route}", headers=auth_headers(), timeout=30)
            assert r.status_code == 200, (route, r.text)
            assert key not in r.text
        r = httpx.get(f"{cluster.api_url}/sched/status/{key}", headers=auth_headers(), timeout=30)
        assert r.status_code != 500, r.text
    finally:

        async def purge() -> None:
            nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
            try:
                await (await nc.jetstream().key_value(JOBS_BUCKET)).purge(key)
            finally:
                await nc.close()

        asyncio.run(purge())


@pytest.mark.parametrize("stream", ["KV_souq-images", "KV_souq-secrets"])
def test_an_agent_cannot_make_a_store_that_records_the_commands(
    cluster: Cluster, stream: str
) -> None:
    """The buckets agents read are a broker's to make: an agent that made one first, with
    subjects of its choosing, would keep every command sent to every worker (configs, env)."""
    _, _, attacker = victim(cluster)

    async def attack() -> list[str]:
        async with as_agent(cluster, attacker) as nc:
            js = nc.jetstream(timeout=2)
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError):
                await js.add_stream(
                    StreamConfig(name=stream, subjects=[f"$KV.{stream[3:]}.>", "souq.worker.>"])
                )
        nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
        try:
            info = await nc.jetstream().stream_info(stream)
            return list(info.config.subjects or [])
        finally:
            await nc.close()

    assert "souq.worker.>" not in asyncio.run(attack())


def test_the_agent_still_runs_as_before(cluster: Cluster) -> None:
    app, machine_id, _ = victim(cluster)
    client = cluster.client()
    client.stop(app, machine_id)
    wait_until(
        lambda: client.get_machine(app, machine_id).state is MachineState.STOPPED,
        message="the machine to stop",
    )
    client.destroy(app, machine_id, force=True)
