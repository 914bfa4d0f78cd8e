"""Dry runs, quotes (a dry run that binds) and cordoned workers, on a real cluster."""

from __future__ import annotations

import uuid

import httpx
import psutil
import pytest

from souq.errors import InsufficientCapacity, NotFound, QuoteExpired, QuoteUsed
from souq.model import MachineState, QuoteState
from souq.testing import Cluster, auth_headers, wait_until
from tests.clusters import ClusterSpec

# Region `q`: two workers of 2 cpus and 1024 MiB each.
CLUSTER = ClusterSpec("q", regions={"q": 2}, cpus=2, memory_mb=1024)


def app_name() -> str:
    return "q" + uuid.uuid4().hex[:10]


def config(cpus: float = 1, memory_mb: int = 128) -> dict[str, object]:
    return {"cmd": ["sleep", "600"], "guest": {"cpus": cpus, "memory_mb": memory_mb}}


def allocated(cluster: Cluster) -> dict[str, float]:
    return {w.id: w.allocated.cpus for w in cluster.client().workers()}


def test_dry_run_explains_and_claims_nothing(cluster: Cluster) -> None:
    app = app_name()
    before = allocated(cluster)
    r = httpx.post(
        f"{cluster.api_url}/v1/apps/{app}/machines",
        params={"dry_run": "true"},
        json={"region": "q", "config": config()},
        headers=auth_headers(),
        timeout=30,
    )
    assert r.status_code == 200, r.text
    record = r.json()["placement"]
    assert r.json()["dry_run"] is True
    assert record["winner"] in before
    assert record["offers_received"] == 2
    assert {o["worker_id"] for o in record["offers"]} == set(before)
    assert all(o["score"] is not None for o in record["offers"])
    assert cluster.client().list_machines(app) == []
    assert allocated(cluster) == before


def test_dry_run_that_would_not_fit_says_why(cluster: Cluster) -> None:
    with pytest.raises(InsufficientCapacity) as err:
        cluster.client().explain_create(app_name(), "q", config(cpus=3))
    assert err.value.details["placement"]["rejections"] == {"insufficient_cpu": 2}


def test_quote_holds_capacity_until_used(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    quote = client.create_quote(app, "q", config(cpus=2), ttl_s=60)
    assert quote.state is QuoteState.HELD
    assert quote.placement is not None
    assert quote.placement.winner == quote.worker_id
    # The hold counts against the worker: it is full for everyone else ...
    assert allocated(cluster)[quote.worker_id] == 2
    other = next(w for w in allocated(cluster) if w != quote.worker_id)
    plain = client.create_machine(app, "q", config(cpus=1))
    assert plain.worker_id == other
    # ... and the quote's holder gets exactly that capacity.
    m = client.create_machine(app, "q", config(cpus=2), quote=quote.id)
    assert m.worker_id == quote.worker_id
    assert m.state == MachineState.STARTED
    assert m.placement is not None
    assert m.placement.request_id == quote.placement.request_id
    assert allocated(cluster)[quote.worker_id] == 2
    used = client.get_quote(app, quote.id)
    assert used.state is QuoteState.USED
    assert used.machine_id == m.id
    with pytest.raises(QuoteUsed):
        client.create_machine(app, "q", config(cpus=2), quote=quote.id)
    for machine in (m, plain):
        client.destroy(app, machine.id, force=True)


def test_quote_expires_and_the_worker_frees_it(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    before = allocated(cluster)
    quote = client.create_quote(app, "q", config(cpus=1), ttl_s=0.5)
    assert allocated(cluster)[quote.worker_id] == before[quote.worker_id] + 1
    # Released by the worker itself once the TTL passes: nobody else asks it to.
    wait_until(lambda: allocated(cluster) == before, timeout=10, message="the hold to expire")
    assert client.get_quote(app, quote.id).state is QuoteState.EXPIRED
    with pytest.raises(QuoteExpired) as err:
        client.create_machine(app, "q", config(cpus=1), quote=quote.id)
    assert err.value.http_status == 410
    assert client.list_machines(app) == []


def test_released_quote_cannot_be_used(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    quote = client.create_quote(app, "q", config(), ttl_s=60)
    assert client.release_quote(app, quote.id).state is QuoteState.RELEASED
    with pytest.raises(QuoteExpired, match="released"):
        client.create_machine(app, "q", config(), quote=quote.id)


def test_quote_of_another_app_or_made_up_is_not_found(cluster: Cluster) -> None:
    client = cluster.client()
    quote = client.create_quote(app_name(), "q", config(), ttl_s=60)
    with pytest.raises(NotFound):
        client.create_machine(app_name(), "q", config(), quote=quote.id)
    with pytest.raises(NotFound, match="not-a-quote not found: it is not a quote id"):
        client.get_quote(app_name(), "not-a-quote")
    client.release_quote(quote.app, quote.id)


def test_a_bigger_machine_than_the_quote_is_refused(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    quote = client.create_quote(app, "q", config(cpus=1), ttl_s=60)
    r = httpx.post(
        f"{cluster.api_url}/v1/apps/{app}/machines",
        json={"region": "q", "config": config(cpus=2), "quote": quote.id},
        headers=auth_headers(),
        timeout=30,
    )
    assert r.status_code == 422
    assert r.json()["status"] == "invalid_input"
    assert client.get_quote(app, quote.id).state is QuoteState.HELD
    client.release_quote(app, quote.id)


def test_cordoned_worker_makes_no_offers_and_keeps_its_machines(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name()
    first = client.create_machine(app, "q", config(cpus=0.5))
    cordoned = client.cordon(first.worker_id)
    assert cordoned.state.value == "cordoned"
    assert {w.id: w.state.value for w in client.workers()}[first.worker_id] == "cordoned"
    try:
        placed = [client.create_machine(app, "q", config(cpus=0.5)) for _ in range(3)]
        assert {m.worker_id for m in placed} != {first.worker_id}
        assert all(m.worker_id != first.worker_id for m in placed)
        record = placed[0].placement
        assert record is not None
        assert record.rejections == {"cordoned": 1}
        # Its machines keep running.
        assert client.get_machine(app, first.id).state == MachineState.STARTED
        assert first.pid is not None
        assert psutil.pid_exists(first.pid)
    finally:
        assert client.uncordon(first.worker_id).state.value == "up"
    wait_until(
        lambda: client.explain_create(app, "q", config(cpus=0.25)).rejections == {},
        message="the worker to offer again",
    )
    for m in [first, *placed]:
        client.destroy(app, m.id, force=True)


def test_cordon_survives_an_agent_restart(cluster: Cluster) -> None:
    client = cluster.client()
    agent = cluster.agents[0]
    assert agent.worker_id is not None
    client.cordon(agent.worker_id)
    try:
        agent.stop()
        agent.start()
        cluster.wait_for_workers()
        states = {w.id: w.state.value for w in client.workers()}
        assert states[agent.worker_id] == "cordoned"
    finally:
        client.uncordon(agent.worker_id)


def test_cordon_of_an_unknown_worker_is_not_found(cluster: Cluster) -> None:
    with pytest.raises(NotFound):
        cluster.client().cordon("wnosuchworker")
