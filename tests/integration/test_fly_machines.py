"""Machines driven as Fly's Go client drives them, on a real cluster: its create body (``init``,
``guest.cpu_kind``, ``stop_config.timeout: "5s"``, ``skip_secrets``, services with
``force_instance_key: null``, checks with Go durations), its stop body, ``?kill=true``, a
restart's query, a wait for several states and a version, leases under Fly's header, and
answers whose JSON types Fly's Go types accept."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from souq.testing import AgentProcess, Cluster, wait_until
from tests.clocks import before_a_minute
from tests.clusters import ClusterSpec
from tests.integration.services_harness import ECHO, app_name, fly_client

NONCE = "fly-machine-lease-nonce"


CLUSTER = ClusterSpec("flym", regions={"mad": 2})


@pytest.fixture
def fly(cluster: Cluster) -> Iterator[httpx.Client]:
    with fly_client(cluster) as c:
        yield c


def launch_body(**config: Any) -> dict[str, Any]:
    """What fly-go's LaunchMachineInput marshals to, for the echo app behind a service."""
    return {
        "config": {
            "env": {"A": "b"},
            "init": {"cmd": ["python3", ECHO]},
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 128},
            "metadata": {"fly_process_group": "app"},
            "services": [
                {
                    "protocol": "tcp",
                    "internal_port": 8080,
                    "autostop": False,
                    "autostart": True,
                    "ports": [{"port": 80, "handlers": ["http"]}],
                    "force_instance_key": None,
                }
            ],
            "checks": {"alive": {"port": 8080, "type": "tcp", "interval": "15s", "timeout": "2s"}},
            "restart": {"policy": "always"},
            "stop_config": {"timeout": "5s", "signal": "SIGTERM"},
            **config,
        },
        "region": "mad",
        "skip_secrets": False,
    }


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def assert_fly_machine(m: dict[str, Any]) -> None:
    """The JSON types Fly's Machine type needs where Souq's fields share its names."""
    for key in ("id", "name", "state", "region", "instance_id", "version", "private_ip"):
        assert isinstance(m[key], str), key
    assert m["version"] == m["instance_id"]
    assert set(m["image_ref"]) >= {"registry", "repository", "tag", "digest", "labels"}
    config = m["config"]
    assert is_int(config["guest"]["cpus"]) and is_int(config["guest"]["memory_mb"])
    assert isinstance(config["stop_config"]["timeout"], str)
    for check in config["checks"].values():
        for key in ("interval", "timeout", "grace_period"):
            assert isinstance(check[key], str), (key, check)
    assert all(is_int(e["timestamp"]) for e in m["events"])


def test_a_fly_create_runs_and_reads_back_in_flys_shape(fly: httpx.Client) -> None:
    app = app_name("f")
    r = fly.post(f"/apps/{app}/machines", json=launch_body())
    assert r.status_code == 201, r.text
    m = r.json()
    assert_fly_machine(m)
    assert m["config"]["init"]["cmd"] == ["python3", ECHO]
    assert m["config"]["cmd"] == ["python3", ECHO]  # Souq's name for the same command
    assert m["config"]["guest"]["cpu_kind"] == "shared"
    assert m["config"]["stop_config"] == {
        "signal": "SIGTERM",
        "timeout": "5s",
        "timeout_s": 5.0,
        "drain_s": 0.5,
    }
    assert m["config"]["checks"]["alive"]["interval"] == "15s"
    assert m["private_ip"]
    # A Fly client's read-modify-write: it sends back what it read, in its own names only.
    read = fly.get(f"/apps/{app}/machines/{m['id']}").json()
    assert_fly_machine(read)
    fly_config = {k: read["config"][k] for k in ("init", "guest", "env", "services", "checks")}
    fly_config["guest"] = {"cpu_kind": "shared", "cpus": 2, "memory_mb": 128}
    updated = fly.post(
        f"/apps/{app}/machines/{m['id']}",
        json={"config": fly_config, "skip_secrets": False},
    )
    assert updated.status_code == 200, updated.text
    after = updated.json()
    assert after["config"]["cmd"] == ["python3", ECHO] and after["config"]["guest"]["cpus"] == 2
    assert after["instance_id"] != m["instance_id"]
    # Wait for the new version, started (Fly's query: version, several states, timeout).
    r = fly.get(
        f"/apps/{app}/machines/{m['id']}/wait",
        params=[
            ("version", after["instance_id"]),
            ("timeout", "60"),
            ("state", "started"),
            ("state", "failed"),
        ],
    )
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "started" and r.json()["instance_id"] == after["instance_id"]
    # Fly's stop body, then its destroy with kill.
    stopped = fly.post(
        f"/apps/{app}/machines/{m['id']}/stop", json={"id": m["id"], "timeout": "0s"}
    )
    assert stopped.status_code == 200, stopped.text
    r = fly.get(
        f"/apps/{app}/machines/{m['id']}/wait", params={"state": "stopped", "timeout": "60"}
    )
    assert r.status_code == 200, r.text
    started = fly.post(f"/apps/{app}/machines/{m['id']}/start")
    assert started.status_code == 200, started.text
    assert started.json()["previous_state"] == "stopped"
    assert fly.delete(f"/apps/{app}/machines/{m['id']}", params={"kill": "true"}).status_code == 200


def test_a_create_without_a_region_goes_where_the_app_is(fly: httpx.Client) -> None:
    app = app_name("f")
    smallest = {"config": {"init": {"exec": ["sleep", "600"]}}, "skip_secrets": False}
    r = fly.post(f"/apps/{app}/machines", json=smallest)
    assert r.status_code == 201, r.text
    assert r.json()["region"] == "mad"
    assert r.json()["config"]["init"]["exec"] == ["sleep", "600"]
    # The placement record says why: where most fit, then where the app's machines are.
    assert "fit in mad, the most" in r.json()["placement"]["region_chosen"]
    again = fly.post(f"/apps/{app}/machines", json=smallest).json()
    assert again["placement"]["region_chosen"] == "most of the app's machines (1) are in mad"
    shown = fly.get(f"/apps/{app}/machines/{again['id']}").json()  # as its worker keeps it
    assert shown["placement"]["region_chosen"] == again["placement"]["region_chosen"]
    named = fly.post(f"/apps/{app}/machines", json={**smallest, "region": "mad"}).json()
    assert named["placement"]["region_chosen"] is None
    for m in (r.json(), again, named):
        fly.delete(f"/apps/{app}/machines/{m['id']}", params={"kill": "true"})


def test_what_souq_cannot_honour_is_refused_naming_the_field(fly: httpx.Client) -> None:
    app = app_name("f")
    for config, field in [
        ({"mounts": [{"volume": "vol_1", "path": "/data", "add_size_gb": 1}]}, "add_size_gb"),
        ({"statics": [{"guest_path": "/app/public", "url_prefix": "/static"}]}, "statics"),
        ({"guest": {"cpus": 1, "memory_mb": 128, "kernel_args": ["quiet"]}}, "kernel_args"),
        ({"init": {"cmd": ["true"], "tty": True}}, "tty"),
    ]:
        r = fly.post(f"/apps/{app}/machines", json=launch_body(**config))
        assert r.status_code == 422, r.text
        assert r.json()["status"] == "invalid_input"
        assert field in r.json()["error"] and "not supported by Souq" in r.json()["error"]
    # Fly's skip_secrets is honoured: the machine keeps it, and starts without the secrets.
    r = fly.post(f"/apps/{app}/machines", json={**launch_body(), "skip_secrets": True})
    assert r.status_code == 201 and r.json()["skip_secrets"] is True, r.text


def test_a_restart_takes_flys_query(fly: httpx.Client, cluster: Cluster) -> None:
    app = app_name("f")
    m = fly.post(f"/apps/{app}/machines", json=launch_body()).json()
    path = f"/apps/{app}/machines/{m['id']}"
    r = fly.post(f"{path}/restart", params={"force_stop": "true", "timeout": "1m30s"})
    assert r.status_code == 200, r.text
    events = fly.get(f"{path}/events").json()
    assert any(e.get("signal") == "SIGKILL" for e in events), events  # force_stop kills
    r = fly.post(f"{path}/restart", params={"force_stop": "false", "timeout": "1x"})
    assert r.status_code == 422 and "timeout" in r.json()["error"]
    fly.delete(path, params={"kill": "true"})


def test_a_lease_under_flys_header_and_shape(fly: httpx.Client) -> None:
    app = app_name("f")
    m = fly.post(f"/apps/{app}/machines", json=launch_body()).json()
    path = f"/apps/{app}/machines/{m['id']}"
    lease = fly.post(f"{path}/lease", params={"ttl": "60"})
    assert lease.status_code == 200, lease.text
    data = lease.json()["data"]
    assert lease.json()["status"] == "success"
    assert isinstance(data["nonce"], str) and isinstance(data["version"], str)
    assert is_int(data["expires_at"]) and data["expires_at"] < 10**11  # seconds
    # While leased, a change needs the nonce: Fly's header is read.
    refused = fly.post(f"{path}/stop", json={"id": m["id"], "timeout": "0s"})
    assert refused.status_code == 409 and refused.json()["status"] == "lease_held"
    r = fly.post(
        f"{path}/stop", json={"id": m["id"], "timeout": "0s"}, headers={NONCE: data["nonce"]}
    )
    assert r.status_code == 200, r.text
    refreshed = fly.post(f"{path}/lease", params={"ttl": "60"}, headers={NONCE: data["nonce"]})
    assert refreshed.status_code == 200 and refreshed.json()["data"]["nonce"] == data["nonce"]
    assert fly.get(f"{path}/lease").json()["data"]["nonce"] == data["nonce"]
    assert fly.delete(f"{path}/lease", headers={NONCE: data["nonce"]}).status_code == 200
    assert fly.delete(path, params={"kill": "true"}).status_code == 200


def test_a_create_with_lease_ttl_answers_the_nonce(fly: httpx.Client) -> None:
    app = app_name("f")
    r = fly.post(f"/apps/{app}/machines", json={**launch_body(), "lease_ttl": 30})
    assert r.status_code == 201, r.text
    nonce = r.json()["nonce"]
    path = f"/apps/{app}/machines/{r.json()['id']}"
    assert fly.get(f"{path}/lease").json()["data"]["nonce"] == nonce
    assert fly.delete(path, params={"kill": "true"}).status_code == 409  # leased
    assert fly.delete(path, params={"kill": "true"}, headers={NONCE: nonce}).status_code == 200
    wait_until(
        lambda: (
            fly.get(path).json().get("state") in ("destroyed", None)
            or fly.get(path).status_code == 404
        ),
        message="the machine destroyed",
    )


def test_auto_destroy_destroys_a_machine_that_exits_and_stays_down(fly: httpx.Client) -> None:
    app = app_name("f")
    body = {
        "config": {"init": {"exec": ["true"]}, "auto_destroy": True, "restart": {"policy": "no"}},
        "region": "mad",
        "skip_secrets": False,
    }
    r = fly.post(f"/apps/{app}/machines", json=body)
    assert r.status_code == 201, r.text
    path = f"/apps/{app}/machines/{r.json()['id']}"
    waited = fly.get(f"{path}/wait", params={"state": "destroyed", "timeout": "60"})
    assert waited.status_code == 200, waited.text
    events = waited.json()["events"]
    assert any(e["type"] == "destroy" and e["source"] == "agent" for e in events), events


def test_a_scheduled_machine_runs_again_when_its_period_has_passed(fly: httpx.Client) -> None:
    app = app_name("f")
    body = {
        "config": {"init": {"exec": ["true"]}, "schedule": "2s", "restart": {"policy": "no"}},
        "region": "mad",
        "skip_secrets": False,
    }
    r = fly.post(f"/apps/{app}/machines", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["config"]["schedule"] == "2s"
    path = f"/apps/{app}/machines/{r.json()['id']}"

    def scheduled_starts() -> int:
        events = fly.get(f"{path}/events").json()
        return sum(1 for e in events if e["type"] == "start" and e["source"] == "agent")

    wait_until(lambda: scheduled_starts() >= 2, timeout=60, message="two scheduled runs")
    bad = fly.post(
        f"/apps/{app}/machines",
        json={**body, "config": {**body["config"], "schedule": "sometimes"}},
    )
    assert bad.status_code == 422 and "schedule" in bad.json()["error"]
    fly.delete(path, params={"kill": "true"})


@contextlib.contextmanager
def _agent_ahead(cluster: Cluster) -> Iterator[AgentProcess]:
    """One more agent, alone in ``bom``, for :func:`tests.clocks.before_a_minute`."""
    agent = cluster.add_agent("bom")
    try:
        cluster.wait_for_workers()
        yield agent
    finally:
        cluster.agents.remove(agent)
        agent.stop()


def test_a_machine_with_a_cron_schedule_starts_at_its_minute(
    cluster: Cluster, fly: httpx.Client
) -> None:
    """A stopped machine of `* * * * *` is started by its agent at the next minute (within a
    second of it), its event saying why; the schedule reads back in the config. The agent's
    clock is set a few seconds before a minute (tests/clocks.py)."""
    with before_a_minute(lambda: _agent_ahead(cluster), budget_s=4) as (_, clock):
        app = app_name("f")
        body = {
            "config": {
                "init": {"exec": ["true"]},
                "schedule": "* * * * *",
                "schedule_time_zone": "Asia/Kolkata",
                "restart": {"policy": "no"},
            },
            "region": "bom",
            "skip_launch": True,
        }
        r = fly.post(f"/apps/{app}/machines", json=body)
        assert r.status_code == 201, r.text
        assert r.json()["config"]["schedule_time_zone"] == "Asia/Kolkata"
        path = f"/apps/{app}/machines/{r.json()['id']}"

        def scheduled() -> list[dict[str, Any]]:
            events = fly.get(f"{path}/events").json()
            return [e for e in events if e["type"] == "start" and e["source"] == "agent"]

        wait_until(
            scheduled, timeout=clock.seconds_left() + 10, message="the start at the agent's minute"
        )
        start = scheduled()[-1]
        prefix = "cron '* * * * *' (Asia/Kolkata): due at "
        assert start["message"].startswith(prefix), start
        due = datetime.fromisoformat(start["message"][len(prefix) :].split(" ")[0])
        assert due.second == 0
        assert int(due.timestamp() * 1000) == clock.minute_ms
        late_ms = start["timestamp"] - clock.minute_ms
        assert 0 <= late_ms < 1000, late_ms
        fly.delete(path, params={"kill": "true"})


def test_a_list_takes_flys_filters(fly: httpx.Client) -> None:
    app = app_name("f")
    body = {"config": {"init": {"exec": ["sleep", "600"]}}, "region": "mad"}
    kept = fly.post(f"/apps/{app}/machines", json=body).json()
    gone = fly.post(f"/apps/{app}/machines", json=body).json()
    stopped = fly.post(f"/apps/{app}/machines", json={**body, "skip_launch": True}).json()
    assert (
        fly.delete(f"/apps/{app}/machines/{gone['id']}", params={"kill": "true"}).status_code == 200
    )

    def ids(**params: str) -> set[str]:
        r = fly.get(f"/apps/{app}/machines", params=params)
        assert r.status_code == 200, r.text
        return {m["id"] for m in r.json()}

    wait_until(lambda: gone["id"] not in ids(), message="the destroyed machine out of the list")
    assert ids() == {kept["id"], stopped["id"]}
    assert ids(state="started") == {kept["id"]}
    assert ids(state="started,created") == {kept["id"], stopped["id"]}
    assert ids(region="syd") == set()
    assert gone["id"] in ids(include_deleted="true")
    summary = fly.get(f"/apps/{app}/machines", params={"summary": "true"}).json()
    assert summary and all("config" not in m and "events" not in m for m in summary)
    assert all(m["state"] and m["region"] == "mad" for m in summary)


def test_an_update_with_lease_ttl_leaves_the_machine_leased(fly: httpx.Client) -> None:
    app = app_name("f")
    m = fly.post(f"/apps/{app}/machines", json=launch_body()).json()
    path = f"/apps/{app}/machines/{m['id']}"
    body = {"config": launch_body()["config"], "skip_secrets": False, "lease_ttl": 30}
    r = fly.post(path, json=body)
    assert r.status_code == 200, r.text
    nonce = r.json()["nonce"]
    assert fly.get(f"{path}/lease").json()["data"]["nonce"] == nonce
    again = fly.post(path, json=body, headers={NONCE: nonce})  # the holder extends it
    assert again.status_code == 200 and again.json()["nonce"] == nonce
    assert fly.post(path, json=body).status_code == 409  # anyone else: lease_held
    assert fly.delete(path, params={"kill": "true"}, headers={NONCE: nonce}).status_code == 200
