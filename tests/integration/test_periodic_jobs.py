"""Periodic batch jobs (``souq job submit --cron``) on a real cluster: NATS with JetStream and
two brokers. Two periodic loops race on one bucket and queue exactly one run per time (driven
by a virtual clock set a year ahead, where the cluster's own brokers find nothing due);
missed times give one catch-up run; ``prohibit_overlap`` skips a time while the last run
lives; over HTTP, a ``* * * * *`` job is queued at its minute, once, whichever broker (two
brokers set a few seconds before a minute: tests/clocks.py); and the bad inputs are 422s naming
the field."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import nats
import pytest

from souq.clock import VirtualClock
from souq.jobs.periodic import PeriodicJobs, run_name
from souq.jobs.store import JobStore
from souq.model.job import JobEvent, JobState, JobSubmit, PeriodicJob
from souq.testing import BrokerProcess, Cluster, auth_headers, wait_until
from tests.clocks import before_a_minute
from tests.clusters import ClusterSpec

HOUR_MS = 3_600_000


# No agents: they would run the runs these tests look at while they wait.
CLUSTER = ClusterSpec("periodic", regions={"mad": 0}, brokers=2)


def _http(cluster: Cluster, broker: int = 0) -> httpx.Client:
    return _http_to(cluster.brokers[broker])


def _http_to(broker: BrokerProcess) -> httpx.Client:
    return httpx.Client(base_url=broker.url, headers=auth_headers(), timeout=30)


def _next_hour_a_year_on() -> int:
    now = int(time.time() * 1000) + 366 * 24 * HOUR_MS
    return now - now % HOUR_MS + HOUR_MS


async def _two_loops(cluster: Cluster, clock: VirtualClock) -> tuple[list[PeriodicJobs], JobStore]:
    loops, store = [], None
    for _ in range(2):  # as two brokers: each its own connection and store
        nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
        store = await JobStore.open(nc, clock=clock)
        loops.append(await PeriodicJobs.open(nc, store, clock=clock))
    assert store is not None
    return loops, store


async def _runs(store: JobStore, name: str) -> list[str]:
    return sorted(j.name for j in await store.all() if j.periodic == name)


def test_two_brokers_queue_each_time_once_and_catch_up_once(cluster: Cluster) -> None:
    hour = _next_hour_a_year_on()
    clock = VirtualClock(start_ms=hour - HOUR_MS + 60_000)  # hh:01, a year ahead

    async def main() -> None:
        loops, store = await _two_loops(cluster, clock)
        spec = JobSubmit(name="hourly-once", command="true", cron="0 * * * *")
        await loops[0].create(PeriodicJob(name=spec.name, spec=spec, created_ms=0))
        await asyncio.gather(*(p.round() for p in loops))
        assert await _runs(store, "hourly-once") == []  # nothing due before the hour
        clock.advance((hour - clock.now_ms()) / 1000)  # the hour: both loops race, thrice
        await asyncio.gather(*(p.round() for p in loops for _ in range(3)))
        assert await _runs(store, "hourly-once") == [run_name("hourly-once", hour)]
        run = await store.get(run_name("hourly-once", hour))
        assert run.scheduled_ms == hour and run.state is JobState.PENDING
        assert run.why.startswith("cron '0 * * * *' (UTC): due at ")
        record = await loops[1].get("hourly-once")
        assert [r.at_ms for r in record.runs] == [hour] and record.next_ms == hour + HOUR_MS
        # down across three hours: one catch-up run, for the latest, the other two counted
        clock.advance(3 * HOUR_MS / 1000 + 30)
        await asyncio.gather(*(p.round() for p in loops for _ in range(2)))
        late = run_name("hourly-once", hour + 3 * HOUR_MS)
        assert await _runs(store, "hourly-once") == sorted([run.name, late])
        assert "2 earlier runs missed" in (await store.get(late)).why

    asyncio.run(main())


def test_prohibit_overlap_skips_a_time_while_the_last_run_lives(cluster: Cluster) -> None:
    hour = _next_hour_a_year_on()
    clock = VirtualClock(start_ms=hour - 1000)

    async def main() -> None:
        loops, store = await _two_loops(cluster, clock)
        spec = JobSubmit(name="no-overlap", command="true", cron="0 * * * *", prohibit_overlap=True)
        await loops[0].create(PeriodicJob(name=spec.name, spec=spec, created_ms=0))
        clock.advance(1)
        await loops[0].round()
        first = run_name("no-overlap", hour)
        clock.advance(HOUR_MS / 1000)  # the first run still waits: this hour is skipped
        await asyncio.gather(*(p.round() for p in loops))
        assert await _runs(store, "no-overlap") == [first]
        skipped = (await loops[1].get("no-overlap")).runs[0]
        assert skipped.job is None and skipped.at_ms == hour + HOUR_MS
        assert f"skipped, run {first} is still pending" in skipped.why
        await store.change(first, JobEvent.CANCEL)  # it ended: the next hour runs
        clock.advance(HOUR_MS / 1000)
        await loops[1].round()
        assert await _runs(store, "no-overlap") == [
            first,
            run_name("no-overlap", hour + 2 * HOUR_MS),
        ]

    asyncio.run(main())


@contextlib.contextmanager
def _brokers_ahead(cluster: Cluster) -> Iterator[list[BrokerProcess]]:
    """Two more brokers of the cluster's bus, started side by side, for
    :func:`tests.clocks.before_a_minute`."""
    brokers = [
        BrokerProcess(nats_url=cluster.nats.url, log_path=cluster.root / f"broker-ahead-{i}.log")
        for i in range(2)
    ]
    try:
        with ThreadPoolExecutor(len(brokers)) as pool:
            for started in [pool.submit(b.start) for b in brokers]:
                started.result()
        yield brokers
    finally:
        for broker in brokers:
            broker.stop()


def test_a_cron_job_is_queued_at_its_minute_once_whichever_broker(cluster: Cluster) -> None:
    """Two brokers whose clocks are set a few seconds before a minute (tests/clocks.py) race to
    queue a ``* * * * *`` job's run at that minute: one run, named by it, queued within a second
    of it. (The cluster's own brokers, on real time and so behind them, race too.)"""
    with (
        before_a_minute(lambda: _brokers_ahead(cluster), budget_s=8) as (brokers, clock),
        _http_to(brokers[0]) as zero,
        _http_to(brokers[1]) as one,
    ):
        r = zero.post(
            "/sched/submit",
            json={
                "name": "every-minute",
                "command": "true",
                "cron": "* * * * *",
                "time_zone": "Europe/Madrid",
            },
        )
        assert r.status_code == 201, r.text
        assert r.json()["explained"] == "Every minute (Europe/Madrid)"
        assert r.json()["next_ms"] == clock.minute_ms
        assert one.get("/sched/periodic/every-minute").status_code == 200  # the cluster's KV

        def runs() -> list[dict[str, object]]:
            return [j for j in one.get("/sched/list").json() if j["periodic"] == "every-minute"]

        wait_until(
            runs, timeout=clock.seconds_left() + 10, message="the run at the brokers' minute"
        )
        (run,) = runs()
        assert run["scheduled_ms"] == clock.minute_ms
        assert run["name"] == run_name("every-minute", clock.minute_ms)
        late_ms = int(run["submitted_ms"]) - clock.minute_ms  # type: ignore[call-overload]
        assert 0 <= late_ms < 1000, late_ms
        wait_until(
            lambda: zero.get("/sched/periodic/every-minute").json()["runs"],
            timeout=10,
            message="the run recorded",
        )
        record = zero.get("/sched/periodic/every-minute").json()
        assert [x["job"] for x in record["runs"]] == [run["name"]]
        assert any(p["name"] == "every-minute" for p in one.get("/sched/periodic").json())
        gone = zero.delete("/sched/periodic/every-minute")
        assert gone.status_code == 200
        assert one.get("/sched/periodic/every-minute").status_code == 404


@pytest.mark.parametrize(
    ("more", "field", "says"),
    [
        ({"cron": "0 0 30 2 *"}, "cron", "never fires"),
        ({"cron": "every tuesday"}, "cron", "cron expression"),
        ({"cron": "61 * * * *"}, "cron", "Bad minute"),
        ({"cron": "0 3 * * *", "time_zone": "Nowhere/Land"}, "time_zone", "unknown"),
    ],
)
def test_bad_periodic_input_is_a_422_naming_the_field(
    cluster: Cluster, more: dict[str, str], field: str, says: str
) -> None:
    with _http(cluster) as http:
        r = http.post("/sched/submit", json={"name": "bad-cron", "command": "true", **more})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["status"] == "invalid_input" and field in body["error"] and says in body["error"]


@pytest.mark.parametrize(
    ("config", "field", "says"),
    [
        ({"schedule": "sometimes"}, "config.schedule", "hourly"),
        ({"schedule": "0 0 30 2 *"}, "config.schedule", "never fires"),
        ({"schedule": "0 0 * *"}, "config.schedule", "five fields"),
        (
            {"schedule": "0 3 * * *", "schedule_time_zone": "Mars/Olympus"},
            "config.schedule_time_zone",
            "unknown",
        ),
    ],
)
def test_a_bad_machine_schedule_is_a_422_naming_the_field(
    cluster: Cluster, config: dict[str, str], field: str, says: str
) -> None:
    with _http(cluster) as http:
        r = http.post(
            "/v1/apps/sched-bad/machines",
            json={"region": "mad", "config": {"cmd": ["true"], **config}},
        )
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["status"] == "invalid_input" and field in body["error"] and says in body["error"]


def test_a_periodic_job_outlives_a_broker_restart(cluster: Cluster) -> None:
    with _http(cluster, 0) as zero:
        r = zero.post(
            "/sched/submit", json={"name": "kept", "command": "true", "cron": "0 3 * * *"}
        )
        assert r.status_code == 201, r.text
    cluster.brokers[0].stop()
    cluster.brokers[0].start()
    with _http(cluster, 0) as zero:
        got = zero.get("/sched/periodic/kept")
        assert got.status_code == 200 and got.json()["spec"]["cron"] == "0 3 * * *"
        assert zero.delete("/sched/periodic/kept").status_code == 200
