"""Hollow workers run batch jobs as agents do (the same runner: pull, claim, start, renew,
stop), with runs that start no process: what the batch benchmark's 100 workers are."""

from __future__ import annotations

from pathlib import Path

import httpx

from souq.natsserver import NatsServer
from souq.testing import BrokerProcess, FleetProcess, wait_until


def test_hollow_workers_pull_and_run_every_job_once(tmp_path: Path) -> None:
    with NatsServer(store_dir=tmp_path / "nats") as nats:
        fleet = FleetProcess(
            nats_url=nats.url,
            region="hollow",
            workers=3,
            log_path=tmp_path / "fleet.log",
            extra_args=["--jobs", "1"],
        )
        broker = BrokerProcess(nats_url=nats.url, log_path=tmp_path / "broker.log")
        try:
            broker.start()
            fleet.start()
            with httpx.Client(base_url=broker.url, timeout=30) as http:
                for i in range(8):
                    body = {"name": f"h{i}", "command": ["sleep", "0.2"], "cpus": 0}
                    assert http.post("/sched/submit", json=body).status_code == 201

                def ended() -> list[dict[str, object]] | None:
                    jobs: list[dict[str, object]] = http.get("/sched/list").json()
                    done = [j for j in jobs if j["state"] == "succeeded"]
                    return jobs if len(done) == 8 else None

                jobs = wait_until(ended, timeout=60, message="every job succeeded")
        finally:
            fleet.stop()
            broker.stop()
    assert all(j["attempts"] == 1 for j in jobs)
    workers = {j["worker"] for j in jobs}
    assert len(workers) >= 2  # one slot each: eight 0.2 s runs cannot all queue on one worker
    for j in jobs:
        ran_ms = int(j["finished_ms"]) - int(j["started_ms"])  # type: ignore[call-overload]
        assert ran_ms >= 200  # the hollow run lasted what its sleep says
