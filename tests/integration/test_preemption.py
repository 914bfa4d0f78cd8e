"""Preemption inside one request, with real parts: nats-server, ``souq agent`` and ``souq
broker`` processes, machines that really run and really get their stop signal.

A create that fits nowhere displaces lower-class machines on the worker its claim reaches; the
worker judges (and chooses the victims) on its own ledger, so three brokers racing never
displace more than their machines need."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from souq.model import Machine
from souq.testing import Cluster, auth_headers, environment, wait_until
from tests.clusters import ClusterSpec
from tests.integration.priority_harness import config

WORKERS = 2
CPUS = 4  # per worker: 8 one-cpu machines fill the region


CLUSTER = ClusterSpec("preempt", regions={"pre": WORKERS}, cpus=CPUS, memory_mb=4096, brokers=3)


def fill_with_spot(cluster: Cluster, app: str) -> list[Machine]:
    """Fill the region with running spot machines, each bidding 1 + its index (above the
    default spot price rule's highest, 0.1: the region's price preempts none of them)."""
    client = cluster.client()
    made = [
        client.create_machine(app, "pre", config("spot", price=1 + i))
        for i in range(WORKERS * CPUS)
    ]
    for m in made:
        client.wait(app, m.id, "started", timeout=30)
    return made


def destroy_all(cluster: Cluster, *apps: str) -> None:
    client = cluster.client()
    for app in apps:
        for machine in client.list_machines(app):
            client.destroy(app, machine.id, force=True)


def free_cpus(cluster: Cluster) -> float:
    workers = [w for w in cluster.client().workers() if w.region == "pre"]
    return sum(w.capacity.cpus - w.allocated.cpus for w in workers)


async def _storm(urls: list[str], app: str, n: int, klass: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        return await asyncio.gather(
            *(
                client.post(
                    f"{urls[i % len(urls)]}/v1/apps/{app}/machines",
                    json={"region": "pre", "config": config(klass)},
                    headers=auth_headers(),
                )
                for i in range(n)
            )
        )


def preempted_event(cluster: Cluster, app: str, machine_id: str) -> dict[str, Any] | None:
    events = cluster.client().events(app, machine_id)
    found = next((e for e in events if e.type == "preempted"), None)
    return None if found is None else found.model_dump()


def test_a_standard_create_in_a_full_region_displaces_the_cheapest_spot_machine(
    cluster: Cluster,
) -> None:
    batch, web = "batch" + uuid.uuid4().hex[:6], "web" + uuid.uuid4().hex[:6]
    spot = fill_with_spot(cluster, batch)
    client = cluster.client()
    assert free_cpus(cluster) == 0

    # A dry run says whom each worker would displace, and displaces nobody.
    dry = client.explain_create(web, "pre", config("standard"))
    assert dry.preemption is not None and dry.winner is not None
    assert sorted(o.preempts or 0 for o in dry.offers) == [1] * WORKERS
    assert not dry.preempted
    assert all(m.state == "started" for m in client.list_machines(batch))

    # Each worker tells what its spot machines could free: the book sends the create straight
    # to a claim that preempts, no worker asked whom it would displace.
    def spot_room() -> list[float]:
        rooms = [w.preemptible or [] for w in client.workers() if w.region == "pre"]
        return [x.resources.cpus for r in rooms for x in r if x.priority_class == "spot"]

    wait_until(lambda: spot_room() == [CPUS] * WORKERS, message="heartbeats say the spot room")
    made = client.create_machine(web, "pre", config("standard"))

    record = made.placement
    assert record is not None and record.preemption is not None
    assert record.preemption.displaces == ["spot"]
    assert record.source == "book" and record.offers_received == record.expected_offers
    (victim,) = record.preempted
    # The cheapest bid on the chosen worker went (bids are the spot machines' indexes).
    on_worker = [m for m in spot if m.worker_id == made.worker_id]
    assert victim.machine_id == min(on_worker, key=lambda m: m.config.max_price or 0).id
    assert victim.app == batch and victim.priority_class == "spot" and victim.running
    # Its owner learns it: an event naming the machine that took the room, and it stops.
    event = wait_until(
        lambda: preempted_event(cluster, batch, victim.machine_id), message="preempted event"
    )
    assert made.id in event["message"] and event["source"] == "agent"
    stopped = client.wait(batch, victim.machine_id, "stopped", timeout=30)
    assert stopped.state == "stopped"
    client.wait(web, made.id, "started", timeout=30)
    # Exactly the room needed changed hands: the region is still exactly full.
    assert free_cpus(cluster) == 0
    others = [m for m in client.list_machines(batch) if m.id != victim.machine_id]
    assert all(m.state == "started" for m in others)
    destroy_all(cluster, batch, web)


def test_spot_and_standard_never_displace_their_own_class(cluster: Cluster) -> None:
    batch, web = "batch" + uuid.uuid4().hex[:6], "web" + uuid.uuid4().hex[:6]
    fill_with_spot(cluster, batch)
    url = cluster.brokers[0].url
    answer = httpx.post(
        f"{url}/v1/apps/{web}/machines",
        json={"region": "pre", "config": config("spot")},
        headers=auth_headers(),
        timeout=30,
    )
    assert answer.status_code == 409 and answer.json()["status"] == "insufficient_capacity"
    assert all(m.state == "started" for m in cluster.client().list_machines(batch))
    destroy_all(cluster, batch, web)


def test_a_machine_of_a_class_that_does_not_exist_or_a_negative_bid_is_refused_naming_it(
    cluster: Cluster,
) -> None:
    url = cluster.brokers[0].url
    for field, bad in (("priority_class", "gold"), ("max_price", -1)):
        body = {"region": "pre", "config": {**config("standard"), field: bad}}
        answer = httpx.post(
            f"{url}/v1/apps/web/machines", json=body, headers=auth_headers(), timeout=30
        )
        assert answer.status_code == 422, answer.text
        assert f"config.{field}" in answer.json()["error"], answer.text
        job = {"name": f"j{uuid.uuid4().hex[:8]}", "command": "true", field: bad}
        answer = httpx.post(f"{url}/sched/submit", json=job, headers=auth_headers(), timeout=30)
        assert answer.status_code == 422, answer.text
        assert field in answer.json()["error"], answer.text


def test_three_brokers_racing_displace_no_more_than_their_machines_need(
    cluster: Cluster,
) -> None:
    batch, web = "batch" + uuid.uuid4().hex[:6], "web" + uuid.uuid4().hex[:6]
    spot = fill_with_spot(cluster, batch)
    urls = [b.url for b in cluster.brokers]

    # Five creates at once over three brokers: each fits nowhere, each displaces one machine.
    answers = asyncio.run(_storm(urls, web, 5, "standard"))
    assert Counter(r.status_code for r in answers) == {201: 5}, [r.text for r in answers]
    placed = [Machine.model_validate_json(r.content) for r in answers]
    displaced = [
        v.machine_id for m in placed for v in (m.placement.preempted if m.placement else [])
    ]
    assert len(displaced) == 5 == len(set(displaced))
    # On each worker, the ones displaced are its cheapest: each claim chose on the ledger it found.
    for worker in {m.worker_id for m in spot}:
        here = sorted((m for m in spot if m.worker_id == worker), key=lambda m: m.config.max_price)
        gone = [m.id for m in here if m.id in displaced]
        assert gone == [m.id for m in here[: len(gone)]], (worker, gone)
    client = cluster.client()
    for victim in displaced:
        client.wait(batch, victim, "stopped", timeout=30)
    still = [m for m in client.list_machines(batch) if m.state == "started"]
    assert len(still) == len(spot) - 5
    assert free_cpus(cluster) == 0  # nothing was displaced that no machine took

    # Six more: three spot machines are left to displace, then standard displaces nobody.
    answers = asyncio.run(_storm(urls, web, 6, "standard"))
    codes = Counter(r.status_code for r in answers)
    assert codes == {201: 3, 409: 3}, [r.text for r in answers]
    refused = [r.json() for r in answers if r.status_code == 409]
    assert {r["status"] for r in refused} == {"insufficient_capacity"}
    later = [Machine.model_validate_json(r.content) for r in answers if r.status_code == 201]
    victims = [v.machine_id for m in later for v in (m.placement.preempted if m.placement else [])]
    assert len(victims) == 3 == len(set(victims)) and not set(victims) & set(displaced)
    for victim in victims:  # as above: a displaced machine is stopping when the create answers
        client.wait(batch, victim, "stopped", timeout=30)
    left = [(m.id, m.worker_id) for m in client.list_machines(batch) if m.state == "started"]
    assert not left, (left, victims, displaced)
    assert free_cpus(cluster) == 0
    destroy_all(cluster, batch, web)


def test_a_spot_batch_job_is_displaced_and_goes_back_to_the_queue(tmp_path: Path) -> None:
    with Cluster(tmp_path, regions={"solo": 0}) as c:
        c.add_agent("solo", cpus=2, extra_args=["--jobs", "2"])
        c.wait_for_workers()
        url = c.api_url
        name = "j" + uuid.uuid4().hex[:8]
        with httpx.Client(base_url=url, headers=auth_headers(), timeout=30) as http:
            job = {"name": name, "command": "sleep 600", "cpus": 2, "priority_class": "spot"}
            assert http.post("/sched/submit", json=job).status_code == 201

            def state() -> str:
                return str(http.get(f"/sched/status/{name}").json()["state"])

            wait_until(lambda: state() == "running", timeout=30, message="the job to run")
            body = {"region": "solo", "config": {"cmd": ["sleep", "600"], "guest": {"cpus": 1}}}
            made = http.post("/v1/apps/web/machines", json=body)
            assert made.status_code == 201, made.text
            record = made.json()["placement"]
            [victim] = record["preempted"]
            assert victim["machine_id"] == f"job:{name}" and victim["priority_class"] == "spot"
            # Back in the queue: the worker has 1 cpu free now, the job needs 2: it waits.
            wait_until(lambda: state() == "pending", timeout=30, message="the job back")
            worker = c.client().workers()[0]
            assert worker.allocated.cpus == 1


def test_a_restarted_agent_counts_a_victim_as_giving_its_room_back(tmp_path: Path) -> None:
    with Cluster(tmp_path, regions={"solo": 0}) as c:
        agent = c.add_agent("solo", cpus=2, stop_machines_on_exit=False)
        c.wait_for_workers()
        client = c.client()
        spot = [
            client.create_machine("batch", "solo", config("spot", price=1 + i)) for i in range(2)
        ]
        made = client.create_machine("web", "solo", config("standard"))
        assert made.placement is not None
        [victim] = [v.machine_id for v in made.placement.preempted]
        assert victim == spot[0].id  # the cheaper bid
        client.wait("batch", victim, "stopped", timeout=30)
        agent.stop()
        agent.start()
        # The new agent reads the victim as holding no room: the worker is full, not over.
        worker = wait_until(
            lambda: next((w for w in client.workers() if w.state == "up"), None),
            timeout=30,
            message="the worker up again",
        )
        assert worker.allocated.cpus == 2
        started = httpx.post(
            f"{c.api_url}/v1/apps/batch/machines/{victim}/start", headers=auth_headers()
        )
        assert started.status_code == 409, started.text  # its room is taken
        assert started.json()["status"] == "insufficient_capacity"


def test_an_agent_dead_between_a_claim_and_its_evictions_displaces_them_at_its_restart(
    tmp_path: Path,
) -> None:
    """The claim records the new machine first, then displaces: the agent killed between the two
    (its fault point right after the new machine's record) leaves every victim running, and the
    restarted agent displaces the one the record names before it starts the new machine."""
    with Cluster(tmp_path, regions={"solo": 0}) as c:
        with environment(SOUQ_FAULT_INJECTION="1"):
            agent = c.add_agent("solo", cpus=2, stop_machines_on_exit=False)
        c.wait_for_workers()
        client = c.client()
        spot = [
            client.create_machine("batch", "solo", config("spot", price=1 + i)) for i in range(2)
        ]
        (agent.data_dir / "fault").write_text("create:spawning")
        proc = agent.process
        assert proc is not None

        async def create_across_the_crash() -> httpx.Response:
            async with httpx.AsyncClient(base_url=c.api_url, timeout=120) as http:
                answer = asyncio.ensure_future(
                    http.post(
                        "/v1/apps/web/machines",
                        json={"region": "solo", "config": config("standard")},
                        headers=auth_headers(),
                    )
                )
                for _ in range(500):
                    if proc.poll() is not None:
                        break
                    await asyncio.sleep(0.02)
                assert proc.poll() == 137, "the fault did not fire"
                restarted.append(time.time() * 1000)
                await asyncio.to_thread(agent.start)
                return await answer

        restarted: list[float] = []
        answer = asyncio.run(create_across_the_crash())
        assert answer.status_code in (201, 503), answer.text  # the claim sent again, or not
        [made] = client.list_machines("web")
        assert made.placement is not None
        [victim] = [v.machine_id for v in made.placement.preempted]
        assert victim == spot[0].id  # the cheaper bid, as the claim chose it
        event = wait_until(
            lambda: preempted_event(c, "batch", victim), message="displaced at the restart"
        )
        assert made.id in event["message"]
        assert event["timestamp"] >= restarted[0]  # nothing was displaced before the crash
        client.wait("batch", victim, "stopped", timeout=30)
        client.wait("web", made.id, "started", timeout=30)
        assert client.get_machine("batch", spot[1].id).state == "started"
        assert preempted_event(c, "batch", spot[1].id) is None
        worker = wait_until(
            lambda: next((w for w in client.workers() if w.machines == 3), None),
            message="a heartbeat of the restarted agent",
        )
        assert worker.allocated.cpus == 2  # full, not over


def _quota(url: str, app: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/v1/apps/{app}/quota", headers=auth_headers(), timeout=30)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _limit(url: str, app: str, **limits: int) -> None:
    answer = httpx.put(
        f"{url}/v1/apps/{app}/quota/all", json=limits, headers=auth_headers(), timeout=30
    )
    assert answer.status_code == 200, answer.text


def test_a_preempted_machine_gives_its_cpus_quota_back_and_its_start_takes_them_again(
    cluster: Cluster,
) -> None:
    batch, web = "batch" + uuid.uuid4().hex[:6], "web" + uuid.uuid4().hex[:6]
    url, other = cluster.brokers[0].url, cluster.brokers[1].url
    _limit(url, batch, cpus=8, memory_mb=512, machines=8)
    fill_with_spot(cluster, batch)
    assert _quota(url, batch)["use"] == {"cpus": 8, "memory_mb": 512, "machines": 8, "volume_gb": 0}
    client = cluster.client()
    made = client.create_machine(web, "pre", config("standard"))
    assert made.placement is not None
    [victim] = [v.machine_id for v in made.placement.preempted]
    client.wait(batch, victim, "stopped", timeout=30)

    # Displaced, it holds no room: its cpus and memory leave the quota's use (its class's too);
    # it is still a machine of the app, counted as one until it is destroyed.
    def use() -> dict[str, Any]:
        return dict(_quota(other, batch)["use"])

    wait_until(lambda: use()["cpus"] == 7, timeout=30, message="the victim's cpus given back")
    shown = _quota(url, batch)
    assert shown["use"] == {"cpus": 7, "memory_mb": 448, "machines": 8, "volume_gb": 0}
    assert shown["use_by_class"]["spot"]["cpus"] == 7
    ninth = httpx.post(
        f"{url}/v1/apps/{batch}/machines",
        json={"region": "pre", "config": config("spot", price=50)},
        headers=auth_headers(),
        timeout=30,
    )
    assert ninth.status_code == 403 and ninth.json()["quota"] == "machines", ninth.text

    # Its room back on its worker, a start takes the cpus again: judged against the quota first.
    client.destroy(web, made.id, force=True)
    _limit(url, batch, cpus=7, machines=8)
    start = f"/v1/apps/{batch}/machines/{victim}/start"
    refused = httpx.post(other + start, headers=auth_headers(), timeout=30)
    assert refused.status_code == 403, refused.text
    err = refused.json()
    assert (err["quota"], err["limit"], err["use"], err["asked"]) == ("cpus", 7, 7, 1), err
    assert client.get_machine(batch, victim).state == "stopped"
    _limit(url, batch, cpus=8, machines=8)
    started = httpx.post(other + start, headers=auth_headers(), timeout=30)
    assert started.status_code == 200, started.text
    client.wait(batch, victim, "started", timeout=30)
    wait_until(lambda: use()["cpus"] == 8, timeout=30, message="the victim counted again")
    # Counted: with room for a ninth machine, its cpu is over the quota.
    _limit(url, batch, cpus=8, machines=9)
    over = httpx.post(
        f"{url}/v1/apps/{batch}/machines",
        json={"region": "pre", "config": config("spot", price=50)},
        headers=auth_headers(),
        timeout=30,
    )
    assert over.status_code == 403, over.text
    assert (over.json()["quota"], over.json()["use"]) == ("cpus", 8), over.text
    destroy_all(cluster, batch, web)
