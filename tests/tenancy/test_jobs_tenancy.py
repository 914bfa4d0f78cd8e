"""The batch queue's tenant boundary, tried as a hostile tenant would, with its own tokens, on a
real cluster (NATS with JetStream and auth, a broker, an agent that runs the small jobs).

Alpha holds every scope of its own app; bravo's job carries a password in its env. Before jobs
belonged to apps, alpha's read token read bravo's spec (the password) and its output, and
alpha's app-admin token cancelled it. Now every ``/sched`` route checks the token against the
job's app: another app's job is ``404 job_not_found`` to alpha, lists hold only what the token
may read, and a job's env values reach only a token that works its queue or reads its app's
secrets. A worker of the seed's sentence holding only a ``queue`` token runs its app's jobs and
nothing else."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from souq.auth.tokens import narrow, public_key_from_text
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec

PASSWORD = "hunter2-bravo-db"  # the secret a hostile tenant is after
BIG = 64  # cpus: more than the agent has, so that only the test's HTTP workers take the job


CLUSTER = ClusterSpec("jobs-tenancy", regions={"mad": 1})


@pytest.fixture(scope="module")
def tokens(cluster: Cluster) -> dict[str, str]:
    """``alpha-read`` ... ``bravo-queue``: each app's token of each scope, and the default
    queue's worker token."""
    made: dict[str, str] = {}
    with cluster.client() as admin:
        for app in ("alpha", "bravo", "default"):
            for scope in ("read", "write", "deploy", "admin", "queue"):
                info = admin.create_token(app=app, scope=scope, name=f"{app} {scope}")
                assert info.token
                made[f"{app}-{scope}"] = info.token
    return made


def _http(cluster: Cluster, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=cluster.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def _submit(cluster: Cluster, token: str, body: dict[str, Any]) -> dict[str, Any]:
    with _http(cluster, token) as http:
        r = http.post("/sched/submit", json=body)
    assert r.status_code == 201, r.text
    job: dict[str, Any] = r.json()
    return job


def _names(answer: httpx.Response) -> set[str]:
    assert answer.status_code == 200, answer.text
    return {j["name"] for j in answer.json()}


def test_another_apps_job_is_not_there_for_alpha(cluster: Cluster, tokens: dict[str, str]) -> None:
    env = {"BRAVO_DB_PASSWORD": PASSWORD}
    job = _submit(
        cluster,
        tokens["bravo-write"],
        {"name": "bravo-migrate", "command": "true", "cpus": BIG, "env": env},
    )
    for scope in ("read", "write", "deploy", "admin", "queue"):
        with _http(cluster, tokens[f"alpha-{scope}"]) as alpha:
            status = alpha.get("/sched/status/bravo-migrate")
            assert (status.status_code, status.json()["status"]) == (404, "job_not_found"), scope
            assert PASSWORD not in status.text
            logs = alpha.get("/sched/logs/bravo-migrate")
            assert (logs.status_code, logs.json()["status"]) == (404, "job_not_found")
            for path in ("/sched/list", "/sched/jobs", "/sched/cancellations"):
                listed = alpha.get(path)
                assert "bravo-migrate" not in _names(listed), (scope, path)
                assert PASSWORD not in listed.text
            # Every verb on the job: as if it did not exist, and the job is untouched.
            for verb in ("cancel", "claim", "renew", "started", "stopped", "release", "return"):
                r = alpha.post(f"/sched/{verb}/bravo-migrate", params={"worker": "alpha-w"})
                assert (r.status_code, r.json()["status"]) == (404, "job_not_found"), (scope, verb)
    with _http(cluster, tokens["bravo-read"]) as bravo:
        seen = bravo.get("/sched/status/bravo-migrate").json()
        assert (seen["state"], seen["cancel_requested"], seen["worker"]) == (
            "pending",
            False,
            None,
        )
    assert job["app"] == seen["app"] == "bravo"  # the token's app


def test_a_token_submits_only_for_its_own_app(cluster: Cluster, tokens: dict[str, str]) -> None:
    with _http(cluster, tokens["alpha-admin"]) as alpha:
        theirs = alpha.post(
            "/sched/submit", json={"name": "planted", "command": "true", "app": "bravo"}
        )
        assert (theirs.status_code, theirs.json()["status"]) == (403, "forbidden")
    with _http(cluster, tokens["alpha-read"]) as reader:
        r = reader.post("/sched/submit", json={"name": "by-reader", "command": "true"})
        assert (r.status_code, r.json()["status"]) == (403, "forbidden")
    with _http(cluster, tokens["alpha-queue"]) as worker:  # a worker submits nothing
        r = worker.post("/sched/submit", json={"name": "by-worker", "command": "true"})
        assert (r.status_code, r.json()["status"]) == (403, "forbidden")
    # A token of every app narrowed to one app names it: the default queue is not its.
    with cluster.client() as admin:
        key = public_key_from_text(admin.token_key())
    only_alpha = narrow(cluster.auth.admin() if cluster.auth else "", key, app="alpha")
    with _http(cluster, only_alpha) as narrowed:
        r = narrowed.post("/sched/submit", json={"name": "unnamed", "command": "true"})
        assert (r.status_code, r.json()["status"]) == (403, "forbidden")
        assert "app" in r.json()["hint"]
        r = narrowed.post("/sched/submit", json={"name": "n-alpha", "command": "x", "app": "alpha"})
        assert r.status_code == 201 and r.json()["app"] == "alpha", r.text
    # A token of every app names the app, or the job is the default queue's.
    with cluster.client() as admin:
        assert admin.submit_job({"name": "for-bravo", "command": "true", "app": "bravo"}).app == (
            "bravo"
        )
        assert admin.submit_job({"name": "unnamed-app", "command": "true", "cpus": BIG}).app == (
            "default"
        )
        assert {"for-bravo", "unnamed-app"} <= {j.name for j in admin.jobs()}


def test_env_values_reach_only_who_may_read_secrets_or_run_the_job(
    cluster: Cluster, tokens: dict[str, str]
) -> None:
    env = {"BRAVO_DB_PASSWORD": PASSWORD}
    _submit(
        cluster,
        tokens["bravo-deploy"],
        {"name": "bravo-env", "command": "true", "cpus": BIG, "env": env},
    )
    for scope in ("read", "write"):  # see the job, not its env's values
        with _http(cluster, tokens[f"bravo-{scope}"]) as bravo:
            for answer in (
                bravo.get("/sched/status/bravo-env"),
                bravo.get("/sched/list"),
                bravo.get("/sched/jobs"),
            ):
                assert answer.status_code == 200, answer.text
                assert PASSWORD not in answer.text, scope
                assert "BRAVO_DB_PASSWORD" in answer.text  # the name stays
    with _http(cluster, tokens["bravo-deploy"]) as deployer:
        assert deployer.get("/sched/status/bravo-env").json()["spec"]["env"] == env
    with _http(cluster, tokens["bravo-queue"]) as worker:  # it runs the job: it needs them
        waiting = worker.get("/sched/jobs")
        assert [j["spec"]["env"] for j in waiting.json() if j["name"] == "bravo-env"] == [env]
        claimed = worker.post("/sched/claim/bravo-env", params={"worker": "bw"})
        assert claimed.status_code == 200, claimed.text
        assert claimed.json()["spec"]["env"] == env
        # A queue token works the queue and reads nothing else of the app.
        assert worker.get("/sched/status/bravo-env").status_code == 403
        assert worker.get("/sched/list").json() == []
        assert worker.get("/v1/apps/bravo/machines").status_code == 403
        assert worker.post("/sched/cancel/bravo-env").status_code == 403
        released = worker.post("/sched/release/bravo-env", params={"worker": "bw"})
        assert released.json()["state"] == "succeeded"


def test_a_seed_worker_with_a_queue_token_runs_its_queue_only(
    cluster: Cluster, tokens: dict[str, str]
) -> None:
    """The seed's sentence — poll /jobs, claim by name, run, release — with the default
    queue's worker token: it sees and runs the default queue's job, never alpha's."""
    with cluster.client() as admin:
        admin.submit_job({"name": "seed-default", "command": "true", "cpus": BIG})
        admin.submit_job({"name": "seed-alpha", "command": "true", "cpus": BIG, "app": "alpha"})
    with _http(cluster, tokens["default-queue"]) as seed:  # anonymous: no ?worker=
        waiting = _names(seed.get("/sched/jobs"))
        assert "seed-default" in waiting and "seed-alpha" not in waiting
        assert seed.post("/sched/claim/seed-alpha").status_code == 404
        claimed = seed.post("/sched/claim/seed-default")
        assert claimed.status_code == 200, claimed.text
        released = seed.post("/sched/release/seed-default", json={"exit_code": 0})
        assert (released.json()["state"], released.json()["attempts"]) == ("succeeded", 1)
    with _http(cluster, tokens["alpha-admin"]) as alpha:
        assert alpha.get("/sched/status/seed-alpha").json()["state"] == "pending"


def test_cancellations_and_the_push_model_keep_to_their_app(
    cluster: Cluster, tokens: dict[str, str]
) -> None:
    _submit(cluster, tokens["bravo-write"], {"name": "bravo-held", "command": "x", "cpus": BIG})
    with _http(cluster, tokens["bravo-queue"]) as bravo:
        reg = bravo.post("/sched/register", json={"name": "bravo-w", "cpu": 1024, "mem": 2**20})
        assert (reg.status_code, reg.json()["app"]) == (200, "bravo")
        assert bravo.post("/sched/claim/bravo-held", params={"worker": "bravo-w"}).is_success
    with _http(cluster, tokens["bravo-write"]) as bravo:
        assert bravo.post("/sched/cancel/bravo-held").json()["cancel_requested"] is True
    with _http(cluster, tokens["alpha-queue"]) as alpha:
        assert "bravo-held" not in _names(alpha.get("/sched/cancellations"))
        # Neither bravo's worker name nor its jobs: alpha cannot take over its registration.
        taken = alpha.post("/sched/register", json={"name": "bravo-w", "cpu": 1, "mem": 1})
        assert (taken.status_code, taken.json()["status"]) == (403, "forbidden")
        assert alpha.get("/sched/assigned", params={"worker": "bravo-w"}).status_code == 403
        mine = alpha.post("/sched/register", json={"name": "alpha-w", "cpu": 1024, "mem": 2**20})
        assert mine.json()["app"] == "alpha"
        assigned = _names(alpha.get("/sched/assigned", params={"worker": "alpha-w"}))
        assert assigned and all(not n.startswith("bravo-") for n in assigned)
    with _http(cluster, tokens["bravo-queue"]) as bravo:
        assert "bravo-held" in _names(bravo.get("/sched/cancellations"))


def test_another_apps_job_output_is_not_there_for_alpha(
    cluster: Cluster, tokens: dict[str, str]
) -> None:
    """The agent runs bravo's small job and keeps its output; bravo reads it, alpha cannot."""
    _submit(
        cluster,
        tokens["bravo-write"],
        {"name": "bravo-report", "command": "echo bravo-only-output"},
    )
    with _http(cluster, tokens["bravo-read"]) as bravo:

        def output() -> str | None:
            r = bravo.get("/sched/logs/bravo-report")
            return r.text if r.status_code == 200 else None

        assert "bravo-only-output" in wait_until(
            output, timeout=60, interval=0.2, message="bravo's job to run on the agent"
        )
    with _http(cluster, tokens["alpha-read"]) as alpha:
        r = alpha.get("/sched/logs/bravo-report")
        assert (r.status_code, r.json()["status"]) == (404, "job_not_found")
        assert "bravo-only-output" not in r.text
