"""Quotas across brokers (docs/quotas.md): real nats-server, ``souq agent`` and ``souq broker``
processes. The ledger is one JetStream key per scope changed by compare-and-set, so brokers
racing for the last slot make exactly the quota's machines; a broker killed between reserving
and the claim's answer leaves a reservation that its deadline and reconciliation settle."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest

from souq.testing import BrokerProcess, Cluster, auth_headers, eventually, wait_until
from tests.clusters import ClusterSpec

REGION = "quota"


CLUSTER = ClusterSpec("quotas", regions={REGION: 2}, cpus=16, memory_mb=8192, brokers=3)


def machine_body(cpus: int = 1, klass: str = "standard") -> dict[str, Any]:
    return {
        "region": REGION,
        "skip_launch": True,
        "config": {
            "cmd": ["sleep", "600"],
            "guest": {"cpus": cpus, "memory_mb": 64},
            "priority_class": klass,
        },
    }


def new_app() -> str:
    return "q" + uuid.uuid4().hex[:10]


def _create(url: str, app: str, **kw: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/apps/{app}/machines", json=machine_body(**kw), headers=auth_headers(), timeout=60
    )


def _quota(url: str, app: str, path: str = "apps") -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/{path}/{app}/quota", headers=auth_headers())
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _set(url: str, name: str, limits: dict[str, Any], path: str = "apps") -> httpx.Response:
    return httpx.put(f"{url}/v1/{path}/{name}/quota", json=limits, headers=auth_headers())


def _destroy_all(cluster: Cluster, app: str) -> None:
    client = cluster.client()
    for machine in client.list_machines(app):
        client.destroy(app, machine.id, force=True)


def test_creates_fit_the_quota_the_next_is_refused_and_a_destroy_frees_it(
    cluster: Cluster,
) -> None:
    url = cluster.api_url
    app = new_app()
    assert _set(url, app, {"machines": 2, "cpus": 3}).status_code == 200
    first = _create(url, app)
    assert first.status_code == 201, first.text
    assert _create(cluster.brokers[1].url, app).status_code == 201
    over = _create(cluster.brokers[2].url, app)
    assert over.status_code == 403, over.text
    err = over.json()
    assert err["status"] == "quota_exceeded"
    assert (err["quota"], err["limit"], err["use"]) == ("machines", 2, 2)
    assert "machines quota" in err["error"] and "limit 2" in err["error"]
    assert "in use 2" in err["error"]
    shown = _quota(url, app)
    assert shown["limits"]["machines"] == 2 and shown["use"]["machines"] == 2
    assert shown["use"]["cpus"] == 2 and shown["pending_creates"] == 0

    cluster.client().destroy(app, first.json()["id"], force=True)
    assert _quota(url, app)["use"]["machines"] == 1
    # cpus: 1 held + 2 asked passes 3: the refusal names the cpus quota.
    big = _create(url, app, cpus=3)
    assert big.status_code == 403 and big.json()["quota"] == "cpus", big.text
    assert _create(url, app).status_code == 201
    assert len(cluster.client().list_machines(app)) == 2
    _destroy_all(cluster, app)
    assert _quota(url, app)["use"]["machines"] == 0


def test_a_bad_limit_is_422_naming_the_field(cluster: Cluster) -> None:
    url = cluster.api_url
    app = new_app()
    for body, field in (
        ({"machines": -1}, "machines"),
        ({"cpus": "lots"}, "cpus"),
        ({"memory_mb": 1.5}, "memory_mb"),
        ({"gpus": 1}, "gpus"),  # an unknown resource
        ({"classes": {"gold": {"cpus": 1}}}, "classes.gold"),  # an unknown class
        ({"classes": {"spot": {"volume_gb": 1}}}, "classes.spot.volume_gb"),
    ):
        r = _set(url, app, body)
        assert r.status_code == 422, (body, r.text)
        assert field in r.json()["error"], r.text
    line = httpx.put(f"{url}/v1/apps/{app}/quota/gold", json={"cpus": 1}, headers=auth_headers())
    assert line.status_code == 422 and "class" in line.json()["error"], line.text
    none = {"cpus": None, "memory_mb": None, "machines": None, "volume_gb": None, "classes": {}}
    assert _quota(url, app)["limits"] == none


async def _storm(
    urls: list[str], app: str, n: int, klass: str = "standard"
) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(
            *(
                client.post(
                    f"{urls[i % len(urls)]}/v1/apps/{app}/machines",
                    json=machine_body(klass=klass),
                    headers=auth_headers(),
                )
                for i in range(n)
            )
        )


def test_three_brokers_racing_make_exactly_the_quota(cluster: Cluster) -> None:
    urls = [b.url for b in cluster.brokers]
    for quota, klass in ((1, "standard"), (5, "standard"), (3, "spot")):
        app = new_app()
        limits = (
            {"machines": quota}
            if klass == "standard"
            else {"classes": {klass: {"machines": quota}}}
        )
        assert _set(urls[0], app, limits).status_code == 200
        answers = asyncio.run(_storm(urls, app, 30, klass))
        codes = Counter(r.status_code for r in answers)
        assert codes == {201: quota, 403: 30 - quota}, [r.text for r in answers]
        assert {r.json()["status"] for r in answers if r.status_code == 403} == {"quota_exceeded"}
        assert len(cluster.client().list_machines(app)) == quota
        for url in urls:
            assert _quota(url, app)["use"]["machines"] == quota
            assert _quota(url, app)["use_by_class"][klass]["machines"] == quota
        _destroy_all(cluster, app)


def test_a_batch_counts_all_its_machines(cluster: Cluster) -> None:
    url = cluster.api_url
    app = new_app()
    assert _set(url, app, {"machines": 3}).status_code == 200
    batch = {"count": 4, **machine_body()}
    path = f"{url}/v1/apps/{app}/machines/batch"
    over = httpx.post(path, json=batch, headers=auth_headers(), timeout=60)
    assert over.status_code == 403 and over.json()["status"] == "quota_exceeded", over.text
    assert over.json()["use"] == 0 and over.json()["asked"] == 4
    made = httpx.post(path, json={**batch, "count": 3}, headers=auth_headers(), timeout=60)
    assert made.status_code == 201, made.text
    shown = _quota(url, app)
    assert shown["use"]["machines"] == 3 and shown["pending_creates"] == 0
    assert _create(url, app).status_code == 403
    _destroy_all(cluster, app)
    assert _quota(url, app)["use"]["machines"] == 0


def test_an_update_that_grows_a_machine_counts_the_growth(cluster: Cluster) -> None:
    url = cluster.api_url
    app = new_app()
    assert _set(url, app, {"cpus": 3}).status_code == 200
    made = _create(url, app, cpus=2)
    assert made.status_code == 201, made.text
    machine_id = made.json()["id"]
    grown = {"config": machine_body(cpus=4)["config"], "skip_launch": True}
    r = httpx.post(
        f"{url}/v1/apps/{app}/machines/{machine_id}",
        json=grown,
        headers=auth_headers(),
        timeout=60,
    )
    assert r.status_code == 403 and r.json()["quota"] == "cpus", r.text
    assert (r.json()["use"], r.json()["asked"]) == (2, 2)
    fits = {"config": machine_body(cpus=3)["config"], "skip_launch": True}
    r = httpx.post(
        f"{url}/v1/apps/{app}/machines/{machine_id}", json=fits, headers=auth_headers(), timeout=60
    )
    assert r.status_code == 200, r.text
    assert _quota(url, app)["use"]["cpus"] == 3
    _destroy_all(cluster, app)


def test_an_org_quota_counts_all_its_apps(cluster: Cluster) -> None:
    url = cluster.api_url
    org = "org" + uuid.uuid4().hex[:8]
    one, two = new_app(), new_app()
    client = cluster.client()
    client.create_app(one, org_slug=org)
    assert _create(url, one).status_code == 201  # before the quota: counted when it is set
    client.create_app(two, org_slug=org)
    r = _set(url, org, {"machines": 3}, path="orgs")
    assert r.status_code == 200 and r.json()["use"]["machines"] == 1, r.text
    assert _create(cluster.brokers[1].url, two).status_code == 201
    assert _create(cluster.brokers[2].url, one).status_code == 201
    over = _create(url, two)
    assert over.status_code == 403, over.text
    assert (over.json()["scope"], over.json()["name"]) == ("org", org)
    assert f"org {org}" in over.json()["error"] and "limit 3" in over.json()["error"]
    assert _quota(url, org, path="orgs")["use"]["machines"] == 3
    _destroy_all(cluster, one)
    assert _create(url, two).status_code == 201
    assert _quota(url, org, path="orgs")["use"]["machines"] == 2
    _destroy_all(cluster, two)


def test_an_apps_own_tokens_may_read_its_quota_but_not_raise_it(cluster: Cluster) -> None:
    url = cluster.api_url
    app = new_app()
    assert _set(url, app, {"machines": 1}).status_code == 200
    with cluster.client() as admin:
        tokens = {
            s: admin.create_token(app=app, scope=s, name=s).token
            for s in ("read", "write", "deploy")
        }
    for scope, token in tokens.items():
        headers = {"Authorization": f"Bearer {token}"}
        raised = httpx.put(f"{url}/v1/apps/{app}/quota", json={"machines": 99}, headers=headers)
        assert raised.status_code == 403 and raised.json()["status"] == "forbidden", scope
        cleared = httpx.delete(f"{url}/v1/apps/{app}/quota", headers=headers)
        assert cleared.status_code == 403, scope
        read = httpx.get(f"{url}/v1/apps/{app}/quota", headers=headers)
        assert read.status_code == 200 and read.json()["limits"]["machines"] == 1, scope
    org_put = httpx.put(
        f"{url}/v1/orgs/personal/quota",
        json={"machines": 99},
        headers={"Authorization": f"Bearer {tokens['deploy']}"},
    )
    assert org_put.status_code == 403


def test_a_broker_killed_mid_create_leaks_no_quota(cluster: Cluster) -> None:
    app = new_app()
    url = cluster.api_url
    assert _set(url, app, {"machines": 1}).status_code == 200
    doomed = BrokerProcess(
        nats_url=cluster.nats.url,
        log_path=cluster.root / f"doomed-{app}.log",
        extra_args=["--quota-reservation", "3"],
    )
    doomed.start()
    agents = [a for a in cluster.agents if a.process is not None]
    try:
        wait_until(
            lambda: (
                len(httpx.get(f"{doomed.url}/v1/workers", headers=auth_headers()).json())
                >= len(agents)
            ),
            timeout=30,
            message="the new broker to see the workers",
        )
        for agent in agents:  # the claim reaches a worker that cannot answer yet
            os.kill(agent.pid, signal.SIGSTOP)

        async def create_and_kill() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                pending = asyncio.ensure_future(
                    client.post(
                        f"{doomed.url}/v1/apps/{app}/machines",
                        json=machine_body(),
                        headers=auth_headers(),
                    )
                )
                await eventually(
                    lambda: _quota(url, app)["pending_creates"] == 1,
                    timeout=20,
                    message="the create to reserve",
                )
                os.kill(doomed.pid, signal.SIGKILL)  # between reserving and the claim's answer
                with pytest.raises(httpx.HTTPError):
                    await pending

        asyncio.run(create_and_kill())
        # Never over the limit: the reservation stands until its deadline.
        refused = _create(url, app)
        assert refused.status_code == 403, refused.text
        assert refused.json()["status"] == "quota_exceeded"
    finally:
        for agent in agents:
            os.kill(agent.pid, signal.SIGCONT)
        doomed.stop()

    # Past the deadline the ledger is reconciled with what exists: the dead broker's claim
    # made its machine (the worker answered it after its broker was gone) or it did not.
    def settled() -> bool:
        shown = _quota(url, app)
        exists = len(cluster.client().list_machines(app))
        return shown["pending_creates"] == 0 and shown["use"]["machines"] == exists

    wait_until(settled, timeout=30, message="the reservation to be reconciled")
    exists = len(cluster.client().list_machines(app))
    nxt = _create(cluster.brokers[1].url, app)
    assert nxt.status_code == (403 if exists else 201), nxt.text
    assert len(cluster.client().list_machines(app)) == 1
    assert _quota(url, app)["use"]["machines"] == 1
    _destroy_all(cluster, app)
    assert _quota(url, app)["use"]["machines"] == 0


def test_the_cli_sets_and_shows_a_quota(cluster: Cluster) -> None:
    app = new_app()
    env = {**os.environ, "SOUQ_API": cluster.api_url}

    def souq(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "souq", "quota", *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)

    done = souq("set", app, "--cpus", "2", "--machines", "1")
    assert done.returncode == 0, done.stderr
    assert _quota(cluster.api_url, app)["limits"]["machines"] == 1
    assert _create(cluster.api_url, app).status_code == 201
    shown = souq("show", app)
    assert shown.returncode == 0, shown.stderr
    assert "1 of 1" in shown.stdout and "no limit" in shown.stdout  # machines; memory_mb
    as_json = json.loads(souq("show", app, "--json").stdout)
    assert as_json["use"]["machines"] == 1
    bad = souq("set", app, "--machines", "-3")
    assert bad.returncode == 2 and "machines" in bad.stderr, bad.stderr
    spot = souq("set", app, "--class", "spot", "--machines", "0")
    assert spot.returncode == 0, spot.stderr
    limits = _quota(cluster.api_url, app)["limits"]
    assert limits["machines"] == 1 and limits["classes"]["spot"]["machines"] == 0  # kept
    assert "spot machines" in souq("show", app).stdout
    assert souq("set", app, "--class", "gold", "--cpus", "1").returncode == 2
    assert souq("set", app, "--class", "spot", "--volume-gb", "1").returncode == 2
    assert souq("clear", app, "--class", "spot").returncode == 0
    assert _quota(cluster.api_url, app)["limits"]["classes"] == {}
    deploy = cluster.client().create_token(app=app, scope="deploy", name="d").token
    refused = subprocess.run(
        [sys.executable, "-m", "souq", "quota", "set", app, "--machines", "9"],
        env={**env, "SOUQ_TOKEN": deploy},
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 1 and "may not admin" in refused.stderr, refused.stderr
    _destroy_all(cluster, app)


def test_a_class_line_holds_its_class_and_the_all_line_every_class(
    cluster: Cluster,
) -> None:
    url = cluster.api_url
    app = new_app()
    limits = {"machines": 4, "classes": {"spot": {"machines": 1}, "standard": {"cpus": 2}}}
    assert _set(url, app, limits).status_code == 200
    first_spot = _create(url, app, klass="spot")
    assert first_spot.status_code == 201, first_spot.text
    over = _create(cluster.brokers[1].url, app, klass="spot")
    assert over.status_code == 403, over.text
    err = over.json()
    assert (err["quota"], err["class"], err["resource"]) == ("spot.machines", "spot", "machines")
    assert (err["limit"], err["use"], err["asked"]) == (1, 1, 1)
    assert "over its spot machines quota: limit 1 machines, in use 1" in err["error"]
    assert _create(url, app).status_code == 201  # standard: its own line, 1 of 2 cpus
    assert _create(url, app).status_code == 201
    cpus = _create(url, app)
    assert cpus.status_code == 403 and cpus.json()["quota"] == "standard.cpus", cpus.text
    assert _create(url, app, klass="reserved").status_code == 201  # no line: all's, 4 of 4
    full = _create(url, app, klass="reserved")
    assert full.status_code == 403, full.text
    assert (full.json()["quota"], full.json()["class"]) == ("machines", "all")
    shown = _quota(url, app)
    assert shown["use"]["machines"] == 4
    by_class = {k: u["machines"] for k, u in shown["use_by_class"].items()}
    assert by_class == {"reserved": 1, "standard": 2, "spot": 1}
    cluster.client().destroy(app, first_spot.json()["id"], force=True)
    assert _create(url, app, klass="spot").status_code == 201  # its quota freed
    # One line replaced alone: the others are kept.
    line = httpx.put(
        f"{url}/v1/apps/{app}/quota/spot", json={"machines": 2}, headers=auth_headers()
    )
    assert line.status_code == 200, line.text
    kept = line.json()["limits"]
    assert kept["machines"] == 4 and kept["classes"]["standard"]["cpus"] == 2
    assert kept["classes"]["spot"]["machines"] == 2
    _destroy_all(cluster, app)


def test_an_update_into_a_full_class_is_refused(cluster: Cluster) -> None:
    url = cluster.api_url
    app = new_app()
    assert _set(url, app, {"classes": {"spot": {"machines": 1}}}).status_code == 200
    assert _create(url, app, klass="spot").status_code == 201
    made = _create(url, app)
    assert made.status_code == 201, made.text
    moved = {"config": machine_body(klass="spot")["config"], "skip_launch": True}
    r = httpx.post(
        f"{url}/v1/apps/{app}/machines/{made.json()['id']}",
        json=moved,
        headers=auth_headers(),
        timeout=60,
    )
    assert r.status_code == 403 and r.json()["quota"] == "spot.machines", r.text
    assert _quota(url, app)["use_by_class"]["spot"]["machines"] == 1
    _destroy_all(cluster, app)


def _volume(url: str, app: str, size_gb: int) -> httpx.Response:
    body = {"name": "data", "region": REGION, "size_gb": size_gb}
    return httpx.post(f"{url}/v1/apps/{app}/volumes", json=body, headers=auth_headers(), timeout=60)


def test_volumes_count_their_size(cluster: Cluster) -> None:
    url = cluster.api_url
    app = new_app()
    assert _set(url, app, {"volume_gb": 3}).status_code == 200
    first = _volume(url, app, 2)
    assert first.status_code == 200, first.text
    over = _volume(cluster.brokers[1].url, app, 2)
    assert over.status_code == 403, over.text
    err = over.json()
    assert (err["status"], err["quota"], err["limit"], err["use"], err["asked"]) == (
        "quota_exceeded",
        "volume_gb",
        3,
        2,
        2,
    )
    assert "volume_gb quota: limit 3 GB, in use 2" in err["error"]
    volume_id = first.json()["id"]
    extend = f"{url}/v1/apps/{app}/volumes/{volume_id}/extend"
    grown = httpx.put(extend, json={"size_gb": 4}, headers=auth_headers(), timeout=60)
    assert grown.status_code == 403 and grown.json()["asked"] == 2, grown.text
    fits = httpx.put(extend, json={"size_gb": 3}, headers=auth_headers(), timeout=60)
    assert fits.status_code == 200, fits.text
    shown = _quota(url, app)
    assert shown["use"]["volume_gb"] == 3 and shown["pending_creates"] == 0
    assert _volume(url, app, 1).status_code == 403
    gone = httpx.delete(f"{url}/v1/apps/{app}/volumes/{volume_id}", headers=auth_headers())
    assert gone.status_code == 200, gone.text
    assert _quota(url, app)["use"]["volume_gb"] == 0
    again = _volume(url, app, 3)
    assert again.status_code == 200, again.text
    httpx.delete(f"{url}/v1/apps/{app}/volumes/{again.json()['id']}", headers=auth_headers())
