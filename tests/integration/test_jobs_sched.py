"""The /sched API on a real cluster (NATS with JetStream, two brokers): the seed's pull and push
models, claims that exactly one claimant wins whichever broker each asks, leases that run out,
cancels, retries, and a queue that outlives a broker."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx
import nats

from souq.jobs.output import JobOutputs
from souq.testing import Cluster, auth_headers, wait_until
from tests.clusters import ClusterSpec

# No agents: they would pull and run the jobs these tests claim over HTTP (their own
# runs are tests/integration/test_jobs_agents.py's).
CLUSTER = ClusterSpec("sched", regions={"mad": 0}, brokers=2)


def _http(cluster: Cluster, broker: int = 0) -> httpx.Client:
    return httpx.Client(base_url=cluster.brokers[broker].url, headers=auth_headers(), timeout=30)


def _submit(http: httpx.Client, name: str, **more: object) -> dict[str, object]:
    r = http.post("/sched/submit", json={"name": name, "command": "true", **more})
    assert r.status_code == 201, r.text
    body: dict[str, object] = r.json()
    return body


def test_submit_status_and_a_name_taken(cluster: Cluster) -> None:
    with _http(cluster) as http:
        job = _submit(http, "hello", command=["echo", "hi"])
        assert job["state"] == "pending" and job["name"] == "hello"
        again = http.post("/sched/submit", json={"name": "hello", "command": "true"})
        assert again.status_code == 409 and again.json()["status"] == "job_exists"
        assert http.get("/sched/status/hello").json()["state"] == "pending"
        assert "hello" in [j["name"] for j in http.get("/sched/jobs").json()]
        missing = http.get("/sched/status/nope")
        assert missing.status_code == 404 and missing.json()["status"] == "job_not_found"
        bad = http.post("/sched/submit", json={"name": "x y", "command": ""})
        assert bad.status_code == 422 and bad.json()["status"] == "invalid_input"


def test_exactly_one_of_many_claimants_wins_across_brokers(cluster: Cluster) -> None:
    with _http(cluster) as http:
        _submit(http, "contended")
    answers: list[int] = []
    lock = threading.Lock()

    def claim(i: int) -> None:
        with _http(cluster, i % 2) as http:
            r = http.post("/sched/claim/contended", params={"worker": f"w{i}"})
        with lock:
            answers.append(r.status_code)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [200] + [409] * 11
    with _http(cluster, 1) as http:
        job = http.get("/sched/status/contended").json()
        assert job["state"] == "claimed" and job["worker"].startswith("w")
        assert "contended" not in [j["name"] for j in http.get("/sched/jobs").json()]
        # Only the holder may start it.
        other = "w99"
        refused = http.post("/sched/started/contended", params={"worker": other})
        assert refused.status_code == 409
        assert (
            http.post("/sched/started/contended", params={"worker": job["worker"]}).json()["state"]
            == "running"
        )
        done = http.post(
            "/sched/stopped/contended", params={"worker": job["worker"]}, json={"exit_code": 0}
        )
        assert done.json()["state"] == "succeeded"


def test_a_lease_that_runs_out_puts_the_job_back(cluster: Cluster) -> None:
    with _http(cluster) as http:
        _submit(http, "orphan")
        held = http.post("/sched/claim/orphan", params={"worker": "gone", "lease_s": 1})
        assert held.status_code == 200
        # The worker never renews: a broker's sweep puts the job back once the lease is over.
        wait_until(
            lambda: http.get("/sched/status/orphan").json()["state"] == "pending",
            timeout=15,
            message="the job back in the queue",
        )
        assert "lease of gone ran out" in http.get("/sched/status/orphan").json()["why"]
        assert http.post("/sched/claim/orphan", params={"worker": "next"}).status_code == 200


def test_cancel_a_waiting_and_a_running_job(cluster: Cluster) -> None:
    with _http(cluster) as http:
        _submit(http, "waiting")
        assert http.post("/sched/cancel/waiting").json()["state"] == "cancelled"
        assert http.post("/sched/claim/waiting").status_code == 409
        _submit(http, "busy")
        http.post("/sched/claim/busy", params={"worker": "w1"})
        http.post("/sched/started/busy", params={"worker": "w1"})
        asked = http.post("/sched/cancel/busy").json()
        assert asked["state"] == "running" and asked["cancel_requested"]
        names = [
            j["name"] for j in http.get("/sched/cancellations", params={"worker": "w1"}).json()
        ]
        assert names == ["busy"]
        stopped = http.post("/sched/stopped/busy", params={"worker": "w1"}, json={"exit_code": -15})
        assert stopped.json()["state"] == "cancelled"


def test_a_failed_run_is_retried_after_its_backoff(cluster: Cluster) -> None:
    with _http(cluster) as http:
        _submit(http, "flaky", restart="on-failure", max_retries=1, backoff_s=0.2)
        for attempt in (1, 2):
            wait_until(
                lambda: http.post("/sched/claim/flaky", params={"worker": "w"}).status_code == 200,
                timeout=10,
                message=f"attempt {attempt} claimable",
            )
            http.post("/sched/started/flaky", params={"worker": "w"})
            out = http.post("/sched/stopped/flaky", params={"worker": "w"}, json={"exit_code": 2})
        job = out.json()
        assert job["state"] == "failed" and job["attempts"] == 2 and job["exit_code"] == 2


def test_the_push_model_assigns_what_fits(cluster: Cluster) -> None:
    with _http(cluster) as http:
        _submit(http, "push-small", cpus=1, memory_mb=100)
        _submit(http, "push-big", cpus=64, memory_mb=100)
        reg = http.post("/sched/register", json={"name": "pusher", "cpu": 2, "mem": 1024})
        assert reg.status_code == 200 and reg.json()["name"] == "pusher"
        mine = [j["name"] for j in http.get("/sched/assigned", params={"worker": "pusher"}).json()]
        assert "push-small" in mine and "push-big" not in mine
        assert (
            http.post("/sched/started/push-small", params={"worker": "pusher"}).status_code == 200
        )
        ended = http.post("/sched/stopped/push-small", params={"worker": "pusher"})
        assert ended.json()["state"] == "succeeded"
        unknown = http.get("/sched/assigned", params={"worker": "stranger"})
        assert unknown.status_code == 404


def test_the_queue_outlives_a_broker(cluster: Cluster, tmp_path: Path) -> None:
    with _http(cluster) as http:
        _submit(http, "durable")
    cluster.brokers[0].stop()
    cluster.brokers[0].start()
    with _http(cluster) as http:
        assert http.get("/sched/status/durable").json()["state"] == "pending"


def test_a_runs_output_is_read_back_from_the_store(cluster: Cluster) -> None:
    with _http(cluster) as http:
        _submit(http, "printer", restart="on-failure", max_retries=1)
        missing = http.get("/sched/logs/nobody")
        assert missing.status_code == 404 and missing.json()["status"] == "job_not_found"
        none_yet = http.get("/sched/logs/printer")
        assert none_yet.status_code == 404 and none_yet.json()["status"] == "not_found"
        assert "has not run yet" in none_yet.json()["error"]

        async def keep(attempt: int, data: bytes) -> None:  # as the worker that ran it does
            nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
            try:
                await (await JobOutputs.open(nc)).put("printer", attempt, data)
            finally:
                await nc.close()

        for attempt, code in ((1, 1), (2, 0)):
            wait_until(
                lambda: (
                    http.post("/sched/claim/printer", params={"worker": "w"}).status_code == 200
                ),
                timeout=10,
                message=f"run {attempt} claimable",
            )
            http.post("/sched/started/printer", params={"worker": "w"})
            asyncio.run(keep(attempt, f"run {attempt}\n".encode()))
            http.post("/sched/stopped/printer", params={"worker": "w"}, json={"exit_code": code})
        last = http.get("/sched/logs/printer")
        assert last.status_code == 200 and last.text == "run 2\n"
        assert last.headers["content-type"].startswith("text/plain")
        assert last.headers["x-souq-attempt"] == "2"
        first = http.get("/sched/logs/printer", params={"attempt": 1})
        assert (first.text, first.headers["x-souq-attempt"]) == ("run 1\n", "1")
        assert http.get("/sched/logs/printer", params={"attempt": 3}).status_code == 404
