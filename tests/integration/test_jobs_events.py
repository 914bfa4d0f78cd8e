"""Changes of batch jobs in the cluster's event stream (``GET /v1/events``, ``souq events``), on
a real cluster (NATS with JetStream, a broker, auth on) with no agents: changes made through
the /sched API, and those written straight into the queue's bucket rather than through a
broker."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import nats

from souq.client import SouqClient
from souq.errors import Unavailable
from souq.jobs.store import JobStore
from souq.model.job import JobEvent
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec

CLUSTER = ClusterSpec("jobs-events", regions={})


def _job_events(client: SouqClient, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in client.cluster_events()
        if e["kind"] == "job" and (e.get("job") or {}).get("name") == name
    ]


def _types(client: SouqClient, name: str) -> list[str]:
    return [e["job"]["type"] for e in _job_events(client, name)]


def test_changes_of_jobs_are_events(cluster: Cluster) -> None:
    client = cluster.client()
    client.submit_job({"name": "ev-cancel", "command": "true"})
    client.cancel_job("ev-cancel")
    wait_until(
        lambda: _types(client, "ev-cancel") == ["submitted", "cancelled"],
        timeout=15,
        message="the submit and the cancel in the event stream",
    )
    cancelled = _job_events(client, "ev-cancel")[-1]
    assert (cancelled["state"], cancelled["previous"]) == ("cancelled", "pending")
    assert cancelled["job"]["why"] == "cancelled before it ran"

    client.submit_job({"name": "ev-run", "command": "true"})
    client.claim_job("ev-run", worker="w1")
    client.renew_job("ev-run", worker="w1")  # a renewed lease is no event
    client.job_started("ev-run", worker="w1")
    client.job_stopped("ev-run", worker="w1", exit_code=0)
    want = ["submitted", "claimed", "started", "succeeded"]
    wait_until(lambda: _types(client, "ev-run") == want, timeout=15, message=f"events {want}")
    ended = _job_events(client, "ev-run")[-1]
    assert (ended["worker_id"], ended["state"], ended["job"]["attempts"]) == ("w1", "succeeded", 1)

    shown = subprocess.run(
        [sys.executable, "-m", "souq", "events"],
        env={**os.environ, "SOUQ_API": cluster.api_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "job     ev-run worker=w1 running -> succeeded (succeeded: exited 0)" in shown.stdout


def test_a_change_made_straight_in_the_bucket_is_an_event(cluster: Cluster) -> None:
    """An agent claims and runs jobs in the queue's bucket itself, without a broker: the
    broker's watch of the bucket still tells the change."""
    client = cluster.client()
    client.submit_job({"name": "ev-direct", "command": "true"})

    async def claim_in_the_bucket() -> None:
        nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
        try:
            store = await JobStore.open(nc)
            await store.change("ev-direct", JobEvent.CLAIM, worker="elsewhere")
        finally:
            await nc.close()

    asyncio.run(claim_in_the_bucket())
    wait_until(
        lambda: _types(client, "ev-direct") == ["submitted", "claimed"],
        timeout=15,
        message="the claim made in the bucket, in the event stream",
    )
    assert _job_events(client, "ev-direct")[-1]["worker_id"] == "elsewhere"


def test_a_change_made_across_a_nats_restart_is_told_once(cluster: Cluster) -> None:
    """NATS restarts (its store kept); a job is cancelled straight in the bucket as soon as it
    is back, maybe before the broker has reconnected. The broker watches again and tells the
    change once: from its watch, or from comparing what it knew with the records it finds."""
    client = cluster.client()
    client.submit_job({"name": "ev-outage", "command": "true"})
    wait_until(lambda: _types(client, "ev-outage") == ["submitted"], timeout=15, message="submit")
    cluster.nats.stop(keep_store=True)
    cluster.nats.start()

    async def cancel_in_the_bucket() -> None:
        nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
        try:
            await (await JobStore.open(nc)).change("ev-outage", JobEvent.CANCEL)
        finally:
            await nc.close()

    asyncio.run(cancel_in_the_bucket())

    def told() -> bool:
        try:
            return _types(client, "ev-outage") == ["submitted", "cancelled"]
        except Unavailable:  # the broker is still reconnecting
            return False

    wait_until(
        told,
        timeout=30,
        interval=0.2,
        message="the cancel told after the outage",
    )
