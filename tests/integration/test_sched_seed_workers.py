"""Workers written to the seed's one sentence of the pull API — "Workers poll /jobs. They /claim
them by name. The server decides which claim wins, awarding it a 200 HTTP response. The worker
runs the job, until it stops, and posts /release." — racing Souq's own agents for one queue, on
a real cluster (NATS with JetStream and auth, a broker, two ``souq agent`` processes). Every job
runs exactly once (twice for an on-failure job whose first run fails), each run leaving a line
in the job's marker file, and ends in the state its exit says."""

from __future__ import annotations

import random
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx

from souq.model.job import DEFAULT_QUEUE
from souq.testing import Cluster, auth_headers, wait_until
from tests.clusters import ClusterSpec, agent

JOBS = 40
SEED_WORKERS = 4
BIG = 12  # the first jobs need more cpus than an agent has: only the seed's workers run them


CLUSTER = ClusterSpec(
    "seed-workers", regions={"mad": 0}, agents=(agent("mad", extra_args=["--jobs", "2"]),) * 2
)


class SeedWorker(threading.Thread):
    """A plain HTTP worker as the seed's sentence has it: poll ``/sched/jobs``, claim one by
    name, run it, post ``/sched/release`` (with the exit code, or, for a worker that says
    nothing of success, no body when it exited 0). Half of them name themselves. Each holds
    only a worker's token of the queue it pulls from (the default queue's ``queue`` scope)."""

    def __init__(self, url: str, n: int, done: threading.Event, token: str) -> None:
        super().__init__(name=f"seed-{n}", daemon=True)
        self.url, self.n, self.done = url, n, done
        self.headers = {"Authorization": f"Bearer {token}"}
        self.params = {"worker": f"seed-{n}"} if n % 2 else {}
        self.ran: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, headers=self.headers, timeout=30) as http:
                while not self.done.is_set():
                    self._round(http)
        except BaseException as exc:  # told by the test, not lost in the thread
            self.error = exc

    def _round(self, http: httpx.Client) -> None:
        waiting = http.get("/sched/jobs")
        assert waiting.status_code == 200, waiting.text
        jobs: list[dict[str, Any]] = waiting.json()
        random.shuffle(jobs)
        for job in jobs:
            name = job["name"]
            claim = http.post(f"/sched/claim/{name}", params=self.params)
            if claim.status_code == 409:  # another claimant won it
                continue
            assert claim.status_code == 200, claim.text
            command = claim.json()["spec"]["command"]
            env = {"PATH": "/usr/bin:/bin", "SOUQ_WORKER_ID": self.name}
            code = subprocess.run(["/bin/sh", "-c", command], env=env, check=False).returncode
            self.ran.append(name)
            body = {"json": {"exit_code": code}} if code or self.n % 2 else {}
            released = http.post(f"/sched/release/{name}", params=self.params, **body)
            assert released.status_code == 200, released.text
            return


def _expected(i: int) -> tuple[str, int, int]:
    """(state, exit code, runs) of job ``i``: it succeeds, fails for good, or fails once under
    on-failure and then succeeds."""
    return [("succeeded", 0, 1), ("succeeded", 0, 1), ("failed", 3, 1), ("succeeded", 0, 2)][i % 4]


def _command(i: int, marker: Path) -> dict[str, Any]:
    mark = f'echo "${{SOUQ_WORKER_ID:-?}}" >> {marker}'
    kind = i % 4
    if kind == 2:
        return {"command": f"{mark}; exit 3"}
    if kind == 3:  # its first run fails; the second succeeds
        return {
            "command": f'{mark}; [ "$(wc -l < {marker})" -ge 2 ]',
            "restart": "on-failure",
            "max_retries": 2,
            "backoff_s": 0.1,
        }
    return {"command": mark}


def test_seed_workers_and_agents_run_each_job_exactly_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    markers.chmod(0o777)  # an agent may run its jobs as another user
    done = threading.Event()
    with cluster.client() as admin:  # the jobs below name no app: the default queue's
        token = admin.create_token(app=DEFAULT_QUEUE, scope="queue", name="seed workers").token
    assert token
    workers = [SeedWorker(cluster.api_url, n, done, token) for n in range(SEED_WORKERS)]
    for worker in workers:
        worker.start()
    names = [f"seed-job-{i}" for i in range(JOBS)]
    with httpx.Client(base_url=cluster.api_url, headers=auth_headers(), timeout=30) as http:
        try:
            for i, name in enumerate(names):
                body = {"name": name, **_command(i, markers / name)}
                if i < BIG:
                    body["cpus"] = 64
                r = http.post("/sched/submit", json=body)
                assert r.status_code == 201, r.text

            def ended() -> list[dict[str, Any]] | None:
                for worker in workers:
                    assert worker.error is None, worker.error
                for i, name in enumerate(names):  # a run too many fails at once
                    marker = markers / name
                    ran = marker.read_text().split() if marker.exists() else []
                    assert len(ran) <= _expected(i)[2], (name, ran)
                jobs = [http.get(f"/sched/status/{n}").json() for n in names]
                return jobs if all(j["state"] in ("succeeded", "failed") for j in jobs) else None

            jobs = wait_until(ended, timeout=120, interval=0.2, message="every job to end")
        finally:
            done.set()
            for worker in workers:
                worker.join(timeout=60)
    for worker in workers:
        assert worker.error is None, worker.error
    runs = {name: (markers / name).read_text().split() for name in names}
    for i, (name, job) in enumerate(zip(names, jobs, strict=True)):
        state, code, count = _expected(i)
        assert len(runs[name]) == count, (name, runs[name], job["why"])
        assert (job["state"], job["exit_code"], job["attempts"]) == (state, code, count), job
    # The big jobs fit no agent: the seed's workers ran them, each once (and were counted).
    assert all(r.startswith("seed-") for name in names[:BIG] for r in runs[name])
    by_seeds = sorted(name for worker in workers for name in worker.ran)
    assert by_seeds == sorted(n for n in names for who in runs[n] if who.startswith("seed-"))
    # Nothing runs again: the queue has none of them waiting, claimed or running.
    with httpx.Client(base_url=cluster.api_url, headers=auth_headers(), timeout=30) as http:
        assert [j["name"] for j in http.get("/sched/jobs").json()] == []
        held = [j for j in http.get("/sched/list").json() if j["name"] in runs]
        assert {j["state"] for j in held} <= {"succeeded", "failed"}


def test_return_gives_a_claimed_job_back_untouched(cluster: Cluster) -> None:
    """The other verb: a worker that claimed what it will not run gives it back, and the job
    waits again with no run counted (Souq's agents do this when they shut down)."""
    with httpx.Client(base_url=cluster.api_url, headers=auth_headers(), timeout=30) as http:
        r = http.post("/sched/submit", json={"name": "given-back", "command": "true", "cpus": 64})
        assert r.status_code == 201, r.text
        claimed = http.post("/sched/claim/given-back", params={"worker": "w1"})
        assert claimed.status_code == 200, claimed.text
        other = http.post("/sched/return/given-back", params={"worker": "w2"})
        assert other.status_code == 409 and other.json()["status"] == "illegal_transition"
        back = http.post("/sched/return/given-back", params={"worker": "w1"})
        assert back.status_code == 200, back.text
        job = back.json()
        assert (job["state"], job["attempts"], job["worker"], job["why"]) == (
            "pending",
            0,
            None,
            "returned by w1",
        )
        again = http.post("/sched/claim/given-back", params={"worker": "w3"})
        assert again.status_code == 200, again.text
        bad = http.post("/sched/release/given-back", json={"exit_code": "x"})
        assert bad.status_code == 422 and "exit_code" in bad.text
        ended = http.post("/sched/release/given-back", params={"worker": "w3"})
        assert (ended.json()["state"], ended.json()["attempts"]) == ("succeeded", 1)
