"""Souq's own agents pull batch jobs and run them, on a real cluster: nats-server with JetStream
and auth on (each agent speaks as its own NATS user), ``souq agent`` processes and a broker.
Jobs run, retry, are cancelled, outlive a killed agent, wait while they fit nowhere, and fail
past their deadline; their output is read back from the broker."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import nats
import nats.errors
import psutil
import pytest

from souq.auth.bus import add_agent, credential
from souq.jobs.output import JobOutputs
from souq.jobs.store import READY_SUBJECT, JobStore
from souq.model.job import JobEvent, JobSubmit
from souq.testing import AgentProcess, Cluster, auth_headers, eventually, wait_until
from tests.clusters import ClusterSpec, agent

SLOTS = 2  # each agent's --jobs
LEASE_S = 4.0  # each agent's --job-lease: a killed agent's job is back this soon
JSON_LOGS = ["--log-format", "json"]  # the agents' INFO lines too, for a failure's reader
AGENT_ARGS = ["--jobs", str(SLOTS), "--job-lease", f"{LEASE_S:g}", *JSON_LOGS]


CLUSTER = ClusterSpec(
    "jobs-agents", regions={"mad": 0}, agents=(agent("mad", extra_args=AGENT_ARGS),) * 2
)


@pytest.fixture
def http(cluster: Cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.api_url, headers=auth_headers(), timeout=30) as client:
        yield client


@pytest.fixture
def big_agent(cluster: Cluster) -> Iterator[AgentProcess]:
    """An agent with room for jobs of 8 cpus (the others have 4 in all) and a lease far longer
    than a test: a job of its that comes back soon was given back, not swept back. Stopped
    after the test, so that the other tests' jobs all have short leases."""
    agent = cluster.add_agent(
        "mad", cpus=16, extra_args=["--jobs", "1", "--job-lease", "300", *JSON_LOGS]
    )
    yield agent
    agent.stop()


def _submit(http: httpx.Client, name: str, command: str | list[str], **more: Any) -> None:
    r = http.post("/sched/submit", json={"name": name, "command": command, **more})
    assert r.status_code == 201, r.text


def _job(http: httpx.Client, name: str) -> dict[str, Any]:
    r = http.get(f"/sched/status/{name}")
    assert r.status_code == 200, r.text
    job: dict[str, Any] = r.json()
    return job


def _ended(http: httpx.Client, name: str, timeout: float = 30) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        job = _job(http, name)
        return job if job["state"] in ("succeeded", "failed", "cancelled") else None

    return wait_until(ended, timeout=timeout, interval=0.05, message=f"job {name} to end")


def _running(http: httpx.Client, name: str, timeout: float = 30) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        job = _job(http, name)
        return job if job["state"] == "running" else None

    return wait_until(running, timeout=timeout, interval=0.05, message=f"job {name} to run")


def _in_the_queue(cluster: Cluster, name: str) -> str:
    """The job's state as the bucket holds it, read on the bus (no broker needed)."""

    async def read() -> str:
        nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
        try:
            return str((await (await JobStore.bind(nc)).get(name)).state)
        finally:
            await nc.close()

    return asyncio.run(read())


def _sleeping(marker: str) -> bool:
    """Whether a job's ``sleep MARKER`` runs (what came before it in the job has run)."""
    return any(
        (proc.info["cmdline"] or [])[:2] == ["sleep", marker]
        for proc in psutil.process_iter(["cmdline"])
    )


def _marked(marker: str) -> list[int]:
    """Pids of processes with ``marker`` in their command line."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(marker in arg for arg in proc.info["cmdline"] or ()):
            found.append(proc.info["pid"])
    return found


def test_a_job_runs_on_an_agent_and_its_output_is_kept(http: httpx.Client) -> None:
    _submit(
        http, "hello", 'echo "hello from $SOUQ_WORKER_ID, attempt $SOUQ_JOB_ATTEMPT"; echo oops >&2'
    )
    job = _ended(http, "hello")
    assert (job["state"], job["exit_code"], job["attempts"]) == ("succeeded", 0, 1)
    logs = http.get("/sched/logs/hello")
    assert logs.status_code == 200 and logs.headers["content-type"].startswith("text/plain")
    assert logs.headers["x-souq-attempt"] == "1"
    assert logs.text.startswith("hello from ") and ", attempt 1\n" in logs.text
    assert "oops\n" in logs.text  # stderr too
    missing = http.get("/sched/logs/nope")
    assert missing.status_code == 404 and missing.json()["status"] == "job_not_found"


def test_many_jobs_spread_over_the_agents_each_run_once_within_its_slots(
    http: httpx.Client,
) -> None:
    names = [f"many-{i}" for i in range(20)]
    for name in names:
        _submit(http, name, 'echo "$SOUQ_WORKER_ID $(date +%s%N)"; sleep 0.3; echo "$(date +%s%N)"')
    spans: dict[str, list[tuple[int, int]]] = {}
    for name in names:
        job = _ended(http, name, timeout=60)
        assert (job["state"], job["attempts"]) == ("succeeded", 1), job
        worker, start, end = http.get(f"/sched/logs/{name}").text.split()
        spans.setdefault(worker, []).append((int(start), int(end)))
    assert len(spans) == 2, f"every agent took some: {sorted(spans)}"
    for worker, runs in spans.items():
        most = max(sum(1 for s, e in runs if s <= at < e) for at, _ in runs)
        assert most <= SLOTS, f"{worker} ran {most} jobs at once"


def test_a_failing_job_is_retried_then_fails(http: httpx.Client) -> None:
    _submit(
        http,
        "flaky",
        'echo "try $SOUQ_JOB_ATTEMPT"; exit 3',
        restart="on-failure",
        max_retries=2,
        backoff_s=0.2,
    )
    job = _ended(http, "flaky")
    assert (job["state"], job["attempts"], job["exit_code"]) == ("failed", 3, 3)
    logs = http.get("/sched/logs/flaky")
    assert logs.headers["x-souq-attempt"] == "3" and logs.text == "try 3\n"


def test_a_running_job_is_cancelled_within_seconds(http: httpx.Client) -> None:
    marker = "600.0444"
    _submit(http, "endless", f"echo started; sleep {marker}; echo never")
    _running(http, "endless")
    wait_until(lambda: _sleeping(marker), message="the job's sleep to start")
    asked = time.monotonic()
    r = http.post("/sched/cancel/endless")
    assert r.status_code == 200 and r.json()["cancel_requested"]
    job = _ended(http, "endless", timeout=10)
    took = time.monotonic() - asked
    assert job["state"] == "cancelled" and job["exit_code"] == -15, job
    assert took < 10, f"cancelled in {took:.1f} s"
    # Killed as it was reported: the kernel may take a moment to end the rest of its group.
    wait_until(lambda: not _marked(marker), timeout=5, message="the job's processes to be gone")
    assert http.get("/sched/logs/endless").text == "started\n"


def test_a_job_that_fits_nowhere_waits_and_a_deadline_fails_it(http: httpx.Client) -> None:
    _submit(http, "huge", "true", cpus=64)
    _submit(http, "huge-due", "true", cpus=64, deadline_s=2)
    marker = "600.0666"
    _submit(http, "slow-due", f"sleep {marker}", deadline_s=3)
    job = _ended(http, "huge-due", timeout=15)
    assert (job["state"], job["why"], job["attempts"]) == ("failed", "its deadline passed", 0)
    job = _ended(http, "slow-due", timeout=15)
    assert (job["state"], job["why"], job["attempts"]) == ("failed", "its deadline passed", 1)
    # Failed by its worker's stop, or by the sweep once its lease ran out (a worker late to
    # renew under load), and then fenced by the worker: gone within the fence's grace.
    wait_until(lambda: not _marked(marker), timeout=5, message="the late run to be stopped")
    # It waited all this while, never taken.
    huge = _job(http, "huge")
    assert (huge["state"], huge["attempts"], huge["worker"]) == ("pending", 0, None)
    none_yet = http.get("/sched/logs/huge")
    assert none_yet.status_code == 404 and none_yet.json()["status"] == "not_found"
    assert http.post("/sched/cancel/huge").json()["state"] == "cancelled"


def test_a_killed_agents_job_runs_again_elsewhere_and_never_twice_at_once(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.add_agent("mad", extra_args=AGENT_ARGS)  # two stay when one is killed
    marker = "600.0555"
    _submit(
        http,
        "survivor",
        f'if [ "$SOUQ_JOB_ATTEMPT" = 1 ]; then sleep {marker}; fi; echo "done on $SOUQ_WORKER_ID"',
    )
    holder = _running(http, "survivor")["worker"]
    wait_until(lambda: _sleeping(marker), message="the first run's sleep to start")
    victim: AgentProcess = next(a for a in cluster.agents if a.worker_id == holder)
    victim.kill()
    # Its watcher kills the run as the agent's end closes its pipe, long before the lease ends.
    wait_until(lambda: not _marked(marker), timeout=5, message="the first run to die")
    assert _job(http, "survivor")["attempts"] == 1, "not run again while the first run lived"
    job = _ended(http, "survivor", timeout=LEASE_S + 20)
    assert (job["state"], job["attempts"]) == ("succeeded", 2), job
    text = http.get("/sched/logs/survivor").text
    assert text.startswith("done on ") and holder not in text


def test_an_agent_restarted_on_its_data_dir_gives_back_at_once_what_it_held(
    big_agent: AgentProcess, http: httpx.Client
) -> None:
    big = big_agent  # the only agent with room for the job
    marker = "600.0777"
    _submit(
        http,
        "comeback",
        f'echo "run $SOUQ_JOB_ATTEMPT"; if [ "$SOUQ_JOB_ATTEMPT" = 1 ]; then sleep {marker}; fi',
        cpus=8,
    )
    assert _running(http, "comeback")["worker"] == big.worker_id
    wait_until(lambda: _sleeping(marker), message="the first run's sleep to start")
    big.kill()
    wait_until(lambda: not _marked(marker), timeout=5, message="the first run to die")
    big.start()  # the same data dir: the same worker
    # Offered to the small agents too, which put it back, until the big one is offered it.
    job = _ended(http, "comeback", timeout=60)
    assert (job["state"], job["attempts"]) == ("succeeded", 2), job
    first = http.get("/sched/logs/comeback", params={"attempt": 1})
    assert first.status_code == 200 and first.text == "run 1\n"  # kept by the restarted agent
    assert http.get("/sched/logs/comeback").text == "run 2\n"
    assert http.get("/sched/logs/comeback", params={"attempt": 3}).status_code == 404


def test_an_agent_may_do_what_running_jobs_needs_and_no_more(cluster: Cluster) -> None:
    assert cluster.auth is not None
    worker = add_agent(cluster.auth, "w-perms")
    violations: list[str] = []

    async def error(exc: Exception) -> None:
        if "permissions violation" in str(exc).lower():
            violations.append(str(exc).lower())

    async def check() -> None:
        broker = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
        agent = await nats.connect(
            cluster.nats.url,
            error_cb=error,
            **credential(cluster.auth, f"agent-{worker}").options(),
        )
        try:
            await (await JobStore.open(broker)).submit(
                JobSubmit(name="perms", command="true", cpus=512)  # no agent takes it
            )
            store = await JobStore.bind(agent)
            sub = await store.runners()
            with contextlib.suppress(nats.errors.TimeoutError):
                for msg in await sub.fetch(1, timeout=2):
                    await msg.nak(delay=0.1)
            await store.change("perms", JobEvent.CLAIM, worker=worker)
            await store.change("perms", JobEvent.START, worker=worker)
            await store.change("perms", JobEvent.RENEW, worker=worker)
            async with contextlib.aclosing(store.follow("perms")) as updates:
                assert (await anext(updates)).state == "running"
            await store.change("perms", JobEvent.RETURN, worker=worker)  # says souq.jobs.ready
            outputs = await JobOutputs.bind(agent)
            assert await outputs.put("perms", 1, b"out\n")
            assert not await outputs.put("perms", 1, b"again\n")
            await agent.publish(f"souq.jobevt.mad.{worker}", b"{}")
            await agent.flush()
            assert violations == []
            # And no more: no other bucket, no other consumer, no stream's deletion or purge,
            # no other worker's events.
            for subject in (
                "$KV.souq-secrets.x",
                "$JS.API.STREAM.DELETE.souq-jobs-ready",
                "$JS.API.STREAM.PURGE.OBJ_souq-job-logs",
                "$JS.API.STREAM.CREATE.KV_souq-jobs",
                "$JS.API.CONSUMER.CREATE.souq-jobs-ready.mine",
                "$JS.API.CONSUMER.MSG.NEXT.KV_souq-jobs.x",
                "souq.jobevt.mad.someone-else",
                READY_SUBJECT + ".x",
            ):
                await agent.publish(subject, b"{}")
            await agent.flush()
            # The server's errors may come after the flush.
            await eventually(lambda: len(violations) >= 8, timeout=5, message="8 violations")
            assert len(violations) == 8, violations
            await (await JobStore.open(broker)).change("perms", JobEvent.CANCEL)
        finally:
            await agent.close()
            await broker.close()

    asyncio.run(check())


def test_the_nats_server_goes_down_and_comes_back(cluster: Cluster, http: httpx.Client) -> None:
    marker = "600.0888"
    _submit(
        http,
        "outage",
        f'echo "run $SOUQ_JOB_ATTEMPT"; if [ "$SOUQ_JOB_ATTEMPT" = 1 ]; then sleep {marker}; fi',
    )
    _submit(http, "outage-waits", "true", cpus=64)  # fits nowhere: waits through it all
    _running(http, "outage")
    wait_until(lambda: _sleeping(marker), message="the first run's sleep to start")
    down_at = time.monotonic()
    cluster.nats.stop(keep_store=True)
    try:
        # No renewal gets through: the run is fenced (killed) before its lease could end, so
        # that a broker that requeues the job once the server is back cannot start a second
        # run beside it.
        wait_until(lambda: not _marked(marker), timeout=LEASE_S + 2, message="the run fenced")
        fenced_after = time.monotonic() - down_at
    finally:
        cluster.nats.start()  # the same store: the queue is as it was
    assert LEASE_S / 3 < fenced_after < LEASE_S, f"fenced {fenced_after:.2f} s into the outage"
    job = _ended(http, "outage", timeout=60)
    assert (job["state"], job["attempts"]) == ("succeeded", 2), job
    assert http.get("/sched/logs/outage", params={"attempt": 1}).text == "run 1\n"
    assert _job(http, "outage-waits")["state"] == "pending"
    assert http.post("/sched/cancel/outage-waits").json()["state"] == "cancelled"


def test_a_job_runs_to_its_end_while_no_broker_runs(cluster: Cluster, http: httpx.Client) -> None:
    marker = "2.0999"
    _submit(http, "brokerless", f"sleep {marker}; echo ok")
    _running(http, "brokerless")
    wait_until(lambda: _sleeping(marker), message="the run's sleep to start")
    cluster.brokers[0].stop()
    try:
        # The agent records the end in the queue itself, not through a broker.
        wait_until(
            lambda: _in_the_queue(cluster, "brokerless") == "succeeded",
            timeout=10,
            interval=0.2,
            message="the run's end recorded",
        )
    finally:
        cluster.brokers[0].start()
    job = _ended(http, "brokerless", timeout=10)
    assert (job["state"], job["attempts"]) == ("succeeded", 1), job
    assert http.get("/sched/logs/brokerless").text == "ok\n"


def test_an_agent_stopped_gives_its_jobs_back(big_agent: AgentProcess, http: httpx.Client) -> None:
    marker = "600.0999"
    _submit(
        http,
        "handed-back",
        f'if [ "$SOUQ_JOB_ATTEMPT" = 1 ]; then sleep {marker}; fi; echo "done on $SOUQ_WORKER_ID"',
        cpus=8,
    )
    assert _running(http, "handed-back")["worker"] == big_agent.worker_id
    wait_until(lambda: _sleeping(marker), message="the first run's sleep to start")
    big_agent.stop()  # SIGTERM: it stops the run and gives the job back before it exits
    assert _marked(marker) == []
    job = _job(http, "handed-back")
    assert (job["state"], job["why"]) == ("pending", f"returned by {big_agent.worker_id}")
    big_agent.start()  # the job's lease (300 s) is far from its end: only the return lets it run
    job = _ended(http, "handed-back", timeout=60)  # (offered to the small agents too)
    assert (job["state"], job["attempts"]) == ("succeeded", 2), job
