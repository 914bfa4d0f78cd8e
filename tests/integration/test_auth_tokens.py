"""API tokens on a real cluster: every route but /healthz and /openapi.json needs one; each scope
reaches as far as it says and no further; a holder narrows a token offline; every mutating call
is in the audit log with the token's id, and the token itself is in no log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import biscuit_auth as biscuit
import httpx

from souq.auth.tokens import Scope, generate_key, mint, narrow, public_key_from_text
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec

SLEEPER = {"region": "mad", "config": {"cmd": ["sleep", "600"]}}


CLUSTER = ClusterSpec("auth", regions={"mad": 1}, brokers=2)  # two: a revocation reaches both


def _http(cluster: Cluster, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=cluster.api_url, headers=headers, timeout=30)


def _token(cluster: Cluster, **kw: object) -> str:
    with cluster.client() as admin:
        info = admin.create_token(**kw)  # type: ignore[arg-type]
    assert info.token
    return info.token


def test_public_routes_and_no_token(cluster: Cluster) -> None:
    with _http(cluster, None) as anon:
        assert anon.get("/healthz").status_code == 200
        assert anon.get("/openapi.json").status_code == 200
        for method, path in [
            ("GET", "/v1/workers"),
            ("GET", "/v1/apps/web/machines"),
            ("POST", "/v1/apps/web/machines"),
            ("GET", "/metrics"),
            ("GET", "/v1/events"),
        ]:
            r = anon.request(method, path, json=SLEEPER)
            assert r.status_code == 401, (method, path, r.text)
            assert r.json()["status"] == "unauthorized"
            assert "Bearer" in r.headers["www-authenticate"]
    with _http(cluster, "not-a-token") as bad:
        r = bad.get("/v1/workers")
        assert r.status_code == 401 and r.json()["status"] == "unauthorized"
    elsewhere, _ = mint(generate_key(), scope=Scope.ADMIN)  # another cluster's key
    with _http(cluster, elsewhere) as other:
        r = other.get("/v1/workers")
        assert r.status_code == 401
        assert "not valid for this cluster" in r.json()["error"]


def test_each_scope_reaches_as_far_as_it_says(cluster: Cluster) -> None:
    read = _token(cluster, app="web", scope="read", name="reader")
    write = _token(cluster, app="web", scope="write", name="writer")
    deploy = _token(cluster, app="web", scope="deploy", name="ci")
    release = {"image": "img", "config": {}, "strategy": "immediate"}
    with _http(cluster, write) as w:
        made = w.post("/v1/apps/web/machines", json=SLEEPER)
        assert made.status_code == 201, made.text
        machine = made.json()["id"]
        assert w.post(f"/v1/apps/web/machines/{machine}/stop").status_code == 200
        r = w.post("/v1/apps/web/releases", json=release)
        assert r.status_code == 403 and r.json()["status"] == "forbidden"
        assert "may not deploy app web" in r.json()["error"]
        assert w.post("/v1/apps/db/machines", json=SLEEPER).status_code == 403  # another app
        assert w.get("/v1/workers").status_code == 403  # the cluster
    with _http(cluster, read) as r_:
        assert r_.get(f"/v1/apps/web/machines/{machine}").status_code == 200
        assert r_.get("/v1/apps/web/machines").status_code == 200
        assert r_.get("/v1/images").status_code == 200  # any app the token has
        refused = r_.delete(f"/v1/apps/web/machines/{machine}")
        assert refused.status_code == 403, refused.text
        assert r_.get("/v1/apps/db/machines").status_code == 403
    with _http(cluster, deploy) as d:
        assert d.post("/v1/apps/web/releases", json=release).status_code == 201
        assert d.post("/v1/tokens", json={"scope": "read"}).status_code == 403  # admin only
        workers = cluster.client().workers()
        r = d.post(f"/v1/workers/{workers[0].id}/cordon")
        assert r.status_code == 403, r.text
        assert d.delete(f"/v1/apps/web/machines/{machine}").status_code == 200


def test_a_holder_narrows_a_token_offline_and_cannot_widen_it(cluster: Cluster) -> None:
    deploy = _token(cluster, app="web", scope="deploy")
    with cluster.client() as admin:
        key = public_key_from_text(admin.token_key())
    reader = narrow(deploy, key, scope=Scope.READ)
    with _http(cluster, reader) as r:
        assert r.get("/v1/apps/web/machines").status_code == 200
        refused = r.post("/v1/apps/web/machines", json=SLEEPER)
        assert refused.status_code == 403
        assert "+1" in refused.json()["error"]  # the narrowed token's identity
    # A block that claims a right is not trusted: only the first block grants.
    forged = (
        biscuit.Biscuit.from_base64(reader, key)
        .append(biscuit.BlockBuilder('right("*", "admin");'))
        .to_base64()
    )
    with _http(cluster, forged) as f:
        assert f.get("/v1/workers").status_code == 403
        assert f.post("/v1/apps/web/machines", json=SLEEPER).status_code == 403
    # An admin token narrowed to one app reaches that app only.
    admin_token = cluster.auth.admin() if cluster.auth else ""
    only_web = narrow(admin_token, key, app="web")
    with _http(cluster, only_web) as o:
        assert o.get("/v1/apps/web/machines").status_code == 200
        assert o.get("/v1/apps/db/machines").status_code == 403
        assert o.get("/v1/workers").status_code == 403


def test_an_expired_token_is_refused(cluster: Cluster) -> None:
    brief = _token(cluster, app="web", scope="read", ttl_s=0.5)
    with _http(cluster, brief) as b:
        wait_until(
            lambda: b.get("/v1/apps/web/machines").status_code == 401,
            timeout=10,
            message="the token to expire",
        )
        assert "expired" in b.get("/v1/apps/web/machines").json()["error"]


def test_audit_log_names_the_token_and_no_log_holds_it(cluster: Cluster) -> None:
    ci = _token(cluster, app="audited", scope="write", name="ci for audited")
    with _http(cluster, ci) as c:
        made = c.post("/v1/apps/audited/machines", json=SLEEPER)
        assert made.status_code == 201
        assert c.post("/v1/apps/other/machines", json=SLEEPER).status_code == 403
        c.delete(f"/v1/apps/audited/machines/{made.json()['id']}", params={"force": "true"})
    with cluster.client() as admin:
        entries = wait_until(
            lambda: (e := admin.audit(app="audited")) and len(e) >= 2 and e,
            timeout=10,
            message="the audit entries",
        )
        calls = [(e.method, e.path.split("/")[-1], e.status, e.token_name) for e in entries]
        assert ("POST", "machines", 201, "ci for audited") in calls
        assert any(e.method == "DELETE" and e.status == 200 for e in entries)
        refused = wait_until(
            lambda: [e for e in admin.audit(app="other") if e.status == 403],
            timeout=10,
            message="the refused call's entry",
        )
        assert refused[0].path == "/v1/apps/other/machines"
        assert all(e.token.startswith("t_") for e in entries)
        assert admin.token_self().scope == "admin"
    assert ci not in cluster.brokers[0].log_tail(10**7)
    for agent in cluster.agents:
        assert ci not in agent.log_tail(10**7)


def test_cli_token_create_narrow_show(cluster: Cluster, tmp_path: Path) -> None:
    env = {**os.environ, "SOUQ_API": cluster.api_url}
    souq = [sys.executable, "-m", "souq"]
    made = subprocess.run(
        [*souq, "token", "create", "--app", "web", "--scope", "write", "--name", "cli"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    token = made.stdout.strip()
    narrowed = subprocess.run(
        [*souq, "token", "narrow", "--scope", "read"],
        env={**env, "SOUQ_TOKEN": token},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    shown = subprocess.run(
        [*souq, "token", "show", "--json"],
        env={**env, "SOUQ_TOKEN": narrowed},
        capture_output=True,
        text=True,
        check=True,
    )
    assert '"narrowed": 1' in shown.stdout and '"app": "web"' in shown.stdout
    refused = subprocess.run(
        [*souq, "machine", "run", "--app", "web", "--region", "mad", "--", "sleep", "1"],
        env={**env, "SOUQ_TOKEN": narrowed},
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 1
    assert "may not write app web" in refused.stderr
    assert narrowed not in refused.stderr and token not in refused.stderr
    anonymous = subprocess.run(
        [*souq, "workers"],
        env={k: v for k, v in env.items() if k != "SOUQ_TOKEN"} | {"HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert anonymous.returncode == 1
    assert "needs a token" in anonymous.stderr


def test_a_revoked_token_and_its_copies_are_refused_by_every_broker(cluster: Cluster) -> None:
    with cluster.client() as admin:
        info = admin.create_token(app="web", scope="write", name="leaked")
        key = public_key_from_text(admin.token_key())
    assert info.token
    copy = narrow(info.token, key, scope=Scope.READ)
    brokers = [b.url for b in cluster.brokers]
    for url in brokers:
        r = httpx.get(f"{url}/v1/apps/web/machines", headers={"Authorization": f"Bearer {copy}"})
        assert r.status_code == 200
    subprocess.run(
        [sys.executable, "-m", "souq", "token", "revoke", info.id],
        env={**os.environ, "SOUQ_API": brokers[0]},
        check=True,
        capture_output=True,
    )

    def refused_everywhere() -> bool:
        for url in brokers:
            for token in (info.token, copy):
                r = httpx.get(
                    f"{url}/v1/apps/web/machines", headers={"Authorization": f"Bearer {token}"}
                )
                if r.status_code != 401 or "revoked" not in r.json()["error"]:
                    return False
        return True

    wait_until(refused_everywhere, timeout=15, message="every broker to refuse the token")
    with cluster.client(broker=1) as admin:
        assert info.id in admin.revoked_tokens()
        assert admin.workers()  # other tokens unaffected


def test_an_entry_made_while_nats_is_down_is_stored_once_when_it_is_back(tmp_path: Path) -> None:
    from souq.errors import SouqError, Unavailable

    with Cluster(tmp_path, regions={"mad": 1}) as cluster, cluster.client() as admin:

        def stored(app: str, status: int) -> list[object] | None:
            try:
                return [e for e in admin.audit(app=app) if e.status == status] or None
            except SouqError:  # JetStream still starting, or the broker coming back
                return None

        made = admin.create_machine("early", "mad", SLEEPER["config"])  # the stream exists
        wait_until(lambda: stored("early", 201), timeout=10, message="the first entry")
        cluster.nats.stop(keep_store=True)
        with _http(cluster, cluster.auth.admin() if cluster.auth else None) as c:
            assert c.post("/v1/apps/outage/machines", json=SLEEPER).status_code == 503
        broker = cluster.brokers[0]
        wait_until(  # JetStream did not take it: the outage outlasts one try
            lambda: (
                "audit: storing an entry failed" in broker.log_tail(10**6)
                or "audit: an entry could not be stored" in broker.log_tail(10**6)
            ),
            timeout=30,
            message="a failed try to store the entry",
        )
        cluster.nats.start()

        entries = wait_until(
            lambda: stored("outage", 503), timeout=60, message="the outage's entry stored"
        )
        assert len(entries) == 1

        def destroyed() -> bool:
            try:  # the broker answers 503 while its workers announce themselves again
                admin.destroy("early", made.id, force=True)
            except Unavailable:
                return False
            return True

        wait_until(destroyed, timeout=30, message="the broker back with its worker")
