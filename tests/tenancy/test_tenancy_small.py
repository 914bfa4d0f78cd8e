"""The smaller holes of the tenancy review, each tried from the outside on a real cluster (NATS
with JetStream and auth, a broker, an agent): a CPU share too small to be one, a standby of
another app's machine, a narrowed token past its ttl, an OOM-killed machine's Fly record."""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from souq.auth.tokens import narrow, public_key_from_text
from souq.drivers.cgroups import detect
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec
from tests.integration.services_harness import edge_proxy

needs_cgroups = pytest.mark.skipif(detect() is None, reason="no usable cgroups on this host")

SLEEPER: dict[str, Any] = {"cmd": ["sleep", "600"], "guest": {"cpus": 0.1, "memory_mb": 32}}


CLUSTER = ClusterSpec("tenancy-small", regions={"mad": 1})


@pytest.fixture(scope="module")
def tokens(cluster: Cluster) -> dict[str, str]:
    made = {}
    with cluster.client() as admin:
        for app in ("alpha", "bravo"):
            info = admin.create_token(app=app, scope="write", name=f"{app} write")
            assert info.token
            made[app] = info.token
    return made


def _http(cluster: Cluster, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=cluster.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def _machines(http: httpx.Client, app: str) -> list[dict[str, Any]]:
    r = http.get(f"/v1/apps/{app}/machines")
    assert r.status_code == 200, r.text
    return list(r.json())


@pytest.mark.parametrize("cpus", ["1e-300", "0.0004", "NaN", "Infinity"])
def test_a_cpu_share_below_a_thousandth_or_not_finite_is_refused(
    cluster: Cluster, tokens: dict[str, str], cpus: str
) -> None:
    body = json.dumps({"region": "mad", "config": {**SLEEPER, "guest": {"cpus": "CPUS"}}})
    with _http(cluster, tokens["alpha"]) as alpha:
        before = len(_machines(alpha, "alpha"))
        r = alpha.post(
            "/v1/apps/alpha/machines",
            content=body.replace('"CPUS"', cpus),  # as written (NaN is no JSON httpx writes)
            headers={"Content-Type": "application/json"},
        )
        assert (r.status_code, r.json()["status"]) == (422, "invalid_input"), r.text
        assert "cpus" in r.text
        assert len(_machines(alpha, "alpha")) == before  # nothing was placed


def test_the_smallest_cpu_share_is_a_thousandth(cluster: Cluster, tokens: dict[str, str]) -> None:
    with _http(cluster, tokens["alpha"]) as alpha:
        r = alpha.post(
            "/v1/apps/alpha/machines",
            json={"region": "mad", "config": {**SLEEPER, "guest": {"cpus": 0.001}}},
        )
        assert r.status_code == 201, r.text
        assert r.json()["config"]["guest"]["cpus"] == 0.001
        gone = alpha.delete(f"/v1/apps/alpha/machines/{r.json()['id']}?force=true")
        assert gone.status_code == 200, gone.text


def test_a_standby_of_another_apps_machine_is_refused(
    cluster: Cluster, tokens: dict[str, str]
) -> None:
    with _http(cluster, tokens["bravo"]) as bravo:
        theirs = bravo.post("/v1/apps/bravo/machines", json={"region": "mad", "config": SLEEPER})
        assert theirs.status_code == 201, theirs.text
        bravo_id = theirs.json()["id"]
    with _http(cluster, tokens["alpha"]) as alpha:
        before = len(_machines(alpha, "alpha"))
        r = alpha.post(
            "/v1/apps/alpha/machines",
            json={"region": "mad", "config": {**SLEEPER, "standbys": [bravo_id]}},
        )
        assert (r.status_code, r.json()["status"]) == (422, "invalid_input"), r.text
        assert f"standbys: machine {bravo_id} is not known in app alpha" in r.json()["error"]
        assert r.json()["field"] == "config.standbys"
        assert len(_machines(alpha, "alpha")) == before


def test_a_narrowed_token_past_its_ttl_is_unauthorized_not_forbidden(
    cluster: Cluster, tokens: dict[str, str]
) -> None:
    with cluster.client() as admin:
        key = public_key_from_text(admin.token_key())
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    expired = narrow(tokens["alpha"], key, ttl_s=60, now=an_hour_ago)
    live = narrow(tokens["alpha"], key, ttl_s=3600)
    with _http(cluster, live) as still:
        assert still.get("/v1/apps/alpha/machines").status_code == 200
        # Within its ttl, a route outside its app is still forbidden (not unauthorized).
        other = still.get("/v1/apps/bravo/machines")
        assert (other.status_code, other.json()["status"]) == (403, "forbidden")
    with _http(cluster, expired) as late:
        for path in ("/v1/apps/alpha/machines", "/v1/apps/bravo/machines"):
            r = late.get(path)
            assert (r.status_code, r.json()["status"]) == (401, "unauthorized"), r.text
            assert "expired at" in r.json()["error"]
            assert r.headers["www-authenticate"].startswith("Bearer")


@needs_cgroups
def test_an_oom_killed_machine_says_so_in_its_fly_exit_event(
    cluster: Cluster, tokens: dict[str, str]
) -> None:
    hog = "b = bytearray(256 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1"
    config = {
        "cmd": [sys.executable, "-c", hog],
        "guest": {"cpus": 0.1, "memory_mb": 64},
        "restart": {"policy": "no"},
    }
    with _http(cluster, tokens["alpha"]) as alpha:
        made = alpha.post("/v1/apps/alpha/machines", json={"region": "mad", "config": config})
        assert made.status_code == 201, made.text
        path = f"/v1/apps/alpha/machines/{made.json()['id']}"

        def exited() -> dict[str, Any] | None:
            record = alpha.get(path).json()
            exits = [e for e in record["events"] if e["type"] == "exit"]
            return exits[0] if exits and record["state"] == "stopped" else None

        event = wait_until(exited, timeout=60, message="the machine to be OOM-killed")
        assert event is not None
        assert "out of memory" in event["message"]
        assert event["request"]["exit_event"]["oom_killed"] is True


def test_the_proxy_admin_port_refuses_revoked_tokens_and_shows_only_the_tokens_app(
    cluster: Cluster, tokens: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    admin_token = cluster.auth.admin() if cluster.auth else ""
    with cluster.client() as admin:
        readers = {
            app: admin.create_token(app=app, scope="read", name=f"{app} proxy reader")
            for app in ("alpha", "bravo")
        }
    served = {**SLEEPER, "services": [{"internal_port": 8080}]}
    ids = {}
    for app in ("alpha", "bravo"):
        with _http(cluster, tokens[app]) as http:
            made = http.post(f"/v1/apps/{app}/machines", json={"region": "mad", "config": served})
            assert made.status_code == 201, made.text
            ids[app] = made.json()["id"]
    with edge_proxy(cluster, tmp_path_factory) as proxy:

        def backends(token: str, **params: str) -> httpx.Response:
            return httpx.get(
                proxy.admin_url + "/backends",
                params=params,
                headers={"Authorization": f"Bearer {token}"},
                timeout=10,
            )

        def both_routed() -> list[dict[str, Any]] | None:
            seen = backends(admin_token).json()
            return seen if {b["machine_id"] for b in seen} >= set(ids.values()) else None

        wait_until(both_routed, timeout=30, message="the proxy to route to both apps")
        alpha_token = readers["alpha"].token or ""
        mine = backends(alpha_token)
        assert mine.status_code == 200, mine.text
        assert {b["app"] for b in mine.json()} == {"alpha"}
        assert ids["alpha"] in {b["machine_id"] for b in mine.json()}
        assert backends(alpha_token, app="bravo").json() == []  # nothing of bravo's
        decisions = httpx.get(
            proxy.admin_url + "/decisions",
            headers={"Authorization": f"Bearer {alpha_token}"},
            timeout=10,
        )
        assert decisions.status_code == 200
        assert {d["app"] for d in decisions.json()} <= {"alpha"}
        assert ids["bravo"] not in decisions.text

        with cluster.client() as admin:
            admin.revoke_token(readers["alpha"].id)

        def refused() -> httpx.Response | None:
            r = backends(alpha_token)
            return r if r.status_code == 401 else None

        r = wait_until(refused, timeout=30, message="the proxy to refuse the revoked token")
        assert r is not None and "revoked" in r.json()["error"]
        assert backends(readers["bravo"].token or "").status_code == 200  # others still serve


def test_a_stop_its_worker_does_not_answer_says_it_may_have_been_applied(
    cluster: Cluster, tokens: dict[str, str]
) -> None:
    with _http(cluster, tokens["alpha"]) as alpha:
        made = alpha.post("/v1/apps/alpha/machines", json={"region": "mad", "config": SLEEPER})
        assert made.status_code == 201, made.text
        path = f"/v1/apps/alpha/machines/{made.json()['id']}"
        agent = cluster.agents[0]
        os.kill(agent.pid, signal.SIGSTOP)  # it gets the stop late, after the broker gave up
        try:
            r = alpha.post(f"{path}/stop")
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        assert (r.status_code, r.json()["status"]) == (503, "unavailable"), r.text
        assert "the stop may have been applied" in r.json()["error"]
        assert "check the machine's state" in r.json()["hint"]
        wait_until(lambda: alpha.get(path).status_code == 200, message="the worker to answer")
