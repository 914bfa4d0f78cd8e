"""The machine calls of flaps (``flaps_machines.go``, ``flaps_machines_wait.go``), one test
each, sent as flaps sends them and read as it reads them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from souq.testing import wait_until
from tests.fly.conftest import fly_error, ok
from tests.fly.decode import SHAPES, GoDecoder, in_go_order
from tests.fly.flaps import (
    Flaps,
    launch_input,
    machine_check,
    machine_config,
    machine_guest,
    machine_init,
    machine_port,
    machine_restart,
    machine_service,
    stop_config,
    stop_input,
)
from tests.integration.services_harness import ECHO

Started = Callable[..., dict[str, Any]]


def echo_config(**fields: Any) -> Any:
    """What flyctl sends for an app with one HTTP service and a check."""
    service = machine_service(
        protocol="tcp",
        internal_port=8080,
        autostop=False,
        autostart=True,
        ports=[machine_port(port=80, handlers=["http"])],
    )
    check = machine_check(port=8080, type="tcp", interval="15s", timeout="2s")
    return machine_config(
        env={"A": "b"},
        init=machine_init(cmd=["python3", ECHO]),
        guest=machine_guest(cpu_kind="shared", cpus=1, memory_mb=128),
        metadata={"fly_process_group": "app", "fly_platform_version": "v2"},
        services=[service],
        checks={"alive": check},
        restart=machine_restart(policy="always"),
        stop_config=stop_config(timeout="5s", signal="SIGTERM"),
        **fields,
    )


def path_of(r: Any) -> str:
    return str(r.request.url.raw_path.decode())


def test_launch(flaps: Flaps, go: GoDecoder, app: str) -> None:
    r = ok(flaps.launch(app, launch_input(config=echo_config(), region="mad")))
    assert (r.request.method, path_of(r)) == ("POST", f"/v1/apps/{app}/machines")
    m = go.decode("machine", r)
    config = m["config"]
    assert m["region"] == "mad" and m["instance_id"] and m["version"] == m["instance_id"]
    assert config["init"]["cmd"] == ["python3", ECHO]
    assert config["guest"] == {"cpu_kind": "shared", "cpus": 1, "memory_mb": 128}
    assert config["stop_config"] == {"timeout": "5s", "signal": "SIGTERM"}
    assert config["checks"]["alive"]["interval"] == "15s"
    assert config["services"][0]["ports"][0] == {"port": 80, "handlers": ["http"]}
    assert config["metadata"]["fly_platform_version"] == "v2"
    # Without a region (flaps omits it when empty): the app's region.
    bare = launch_input(config=machine_config(init=machine_init(exec=["sleep", "600"])))
    other = go.decode("machine", ok(flaps.launch(app, bare)))
    assert other["region"] == "mad" and other["config"]["init"]["exec"] == ["sleep", "600"]


def test_update(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started(echo_config())
    # flyctl's read-modify-write: the config as the client decoded it, changed, sent back.
    held = go.decode("machine", ok(flaps.get(app, m["id"])))
    config = in_go_order(held["config"], SHAPES["machine"]["config"])
    config["guest"]["cpus"] = 2
    config["env"]["A"] = "c"
    r = ok(flaps.update(app, m["id"], launch_input(config=config)))
    assert path_of(r) == f"/v1/apps/{app}/machines/{m['id']}"
    after = go.decode("machine", r)
    assert after["config"]["guest"]["cpus"] == 2 and after["config"]["env"] == {"A": "c"}
    assert after["config"]["init"]["cmd"] == ["python3", ECHO]  # the command kept
    assert after["instance_id"] != m["instance_id"]
    ok(flaps.wait(app, m["id"], "started", version=after["instance_id"]))


def test_stop_and_start(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started()
    r = ok(flaps.stop(app, stop_input(id=m["id"])))
    assert r.request.content == b'{"id":"%s","timeout":"0s"}' % m["id"].encode()
    ok(flaps.wait(app, m["id"], "stopped"))
    r = ok(flaps.start(app, m["id"]))
    assert path_of(r) == f"/v1/apps/{app}/machines/{m['id']}/start" and not r.request.content
    assert go.decode("start", r)["previous_state"] == "stopped"
    ok(flaps.wait(app, m["id"], "started"))
    # With a signal and a timeout (a Go duration).
    ok(flaps.stop(app, stop_input(id=m["id"], signal="SIGTERM", timeout="1m30s")))
    ok(flaps.wait(app, m["id"], "stopped"))


def test_restart(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started()
    r = ok(flaps.restart(app, m["id"], force_stop=False, timeout_ns=90 * 10**9, signal="SIGTERM"))
    assert path_of(r).endswith("/restart?force_stop=false&timeout=1m30s&signal=SIGTERM")
    ok(flaps.wait(app, m["id"], "started"))
    r = ok(flaps.restart(app, m["id"], force_stop=True))
    assert path_of(r).endswith("/restart?force_stop=true")
    ok(flaps.wait(app, m["id"], "started"))
    got = go.decode("machine", ok(flaps.get(app, m["id"])))
    kills = [e for e in got["events"] if (e.get("request") or {}).get("exit_event")]
    assert any(e["request"]["exit_event"].get("signal") == 9 for e in kills), got["events"]


def test_get(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started(echo_config())
    r = ok(flaps.get(app, m["id"]))
    assert (r.request.method, path_of(r)) == ("GET", f"/v1/apps/{app}/machines/{m['id']}")
    assert "content-type" not in r.request.headers
    got = go.decode("machine", r)
    assert got["id"] == m["id"] and got["state"] == "started" and got["private_ip"]
    assert got["config"]["init"]["cmd"] == ["python3", ECHO]
    assert all(isinstance(e["timestamp"], int) for e in got["events"])


def test_get_many(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    ids = [started()["id"], started()["id"]]
    held = [go.decode("machine", ok(flaps.get(app, i))) for i in ids]  # Get per id
    assert [m["id"] for m in held] == ids


def test_list(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    ids = {started(echo_config())["id"], started()["id"]}
    r = ok(flaps.list(app))
    assert path_of(r) == f"/v1/apps/{app}/machines"
    assert {m["id"] for m in go.decode("machines", r)} == ids
    # List with a query (flaps puts the caller's string after "?" as it is).
    r = ok(flaps.list(app, "region=mad"))
    assert path_of(r) == f"/v1/apps/{app}/machines?region=mad"
    assert {m["id"] for m in go.decode("machines", r)} == ids


def test_list_takes_flys_query(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    """flaps' ``List(ctx, app, query)`` sends the caller's string after ``?`` verbatim; Souq
    applies Fly's ``region``, ``state`` (comma-separated or repeated), ``include_deleted`` and
    ``summary``."""
    running, stopped, gone = started()["id"], started()["id"], started()["id"]
    ok(flaps.stop(app, stop_input(id=stopped)))
    ok(flaps.wait(app, stopped, "stopped"))
    ok(flaps.destroy(app, gone, kill=True))
    ok(flaps.wait(app, gone, "destroyed"))

    def listed(query: str) -> set[str]:
        r = ok(flaps.list(app, query))
        assert path_of(r) == f"/v1/apps/{app}/machines" + (f"?{query}" if query else "")
        return {m["id"] for m in go.decode("machines", r)}

    wait_until(lambda: gone not in listed(""), timeout=30, message="the destroyed one unlisted")
    assert listed("") == {running, stopped}
    assert listed("state=started") == {running}
    assert listed("state=started,stopped") == {running, stopped}
    assert listed("state=started&state=stopped") == {running, stopped}
    assert listed("region=mad&state=stopped") == {stopped}
    assert listed("region=syd") == set()
    assert listed("include_deleted=true") == {running, stopped, gone}
    assert listed("include_deleted=true&state=destroyed") == {gone}
    r = ok(flaps.list(app, "summary=true"))
    summary = go.decode("machines", r)
    assert {m["id"] for m in summary} == {running, stopped}
    assert all("config" not in m and "events" not in m for m in summary)
    assert all(m["state"] and m["region"] == "mad" and m["instance_id"] for m in summary)


def test_list_active(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    keep = started(echo_config())["id"]
    gone = started()["id"]
    ok(flaps.destroy(app, gone, kill=True))
    ok(flaps.wait(app, gone, "destroyed"))
    listed = go.decode("machines", ok(flaps.list(app)))

    def active(m: dict[str, Any]) -> bool:  # ListActive's filter
        group = ((m.get("config") or {}).get("metadata") or {}).get("fly_process_group")
        return m["state"] not in ("destroyed", "destroying") and group not in (
            "fly_app_release_command",
            "fly_app_console",
        )

    assert [m["id"] for m in listed if active(m)] == [keep]


def test_destroy(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started()
    r = flaps.destroy(app, m["id"], kill=False)  # a started machine, not killed: refused
    fly_error(go, r, 409, "illegal_transition", "started")
    r = ok(flaps.destroy(app, m["id"], kill=True))
    assert path_of(r) == f"/v1/apps/{app}/machines/{m['id']}?kill=true"
    ok(flaps.wait(app, m["id"], "destroyed"))
    stopped = started()
    ok(flaps.stop(app, stop_input(id=stopped["id"])))
    ok(flaps.wait(app, stopped["id"], "stopped"))
    r = ok(flaps.destroy(app, stopped["id"], kill=False))
    assert path_of(r).endswith("?kill=false")
    ok(flaps.wait(app, stopped["id"], "destroyed"))


def test_kill(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    config = machine_config(
        init=machine_init(exec=["sleep", "600"]), restart=machine_restart(policy="no")
    )
    m = started(config)
    r = ok(flaps.kill(app, m["id"]))
    assert r.request.content == b'{"signal":9}'
    ok(flaps.wait(app, m["id"], "stopped", "failed"))


def test_suspend(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started()
    r = ok(flaps.suspend(app, m["id"]))
    assert path_of(r).endswith(f"/{m['id']}/suspend") and not r.request.content
    ok(flaps.wait(app, m["id"], "suspended"))
    assert go.decode("start", ok(flaps.start(app, m["id"])))["previous_state"] == "suspended"


def test_wait(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started()
    r = ok(flaps.wait(app, m["id"]))  # no state given: started, 60 s
    assert path_of(r).endswith(f"/{m['id']}/wait?state=started&timeout=60")
    # Several states: any of them.
    ok(flaps.stop(app, stop_input(id=m["id"])))
    r = ok(flaps.wait(app, m["id"], "destroyed", "stopped", timeout_s=30))
    assert path_of(r).endswith("/wait?state=destroyed&state=stopped&timeout=30")
    # Not reached within the timeout (clamped to at least 1 s): 408.
    r = flaps.wait(app, m["id"], "started", timeout_s=0.2)
    assert path_of(r).endswith("/wait?state=started&timeout=1")
    fly_error(go, r, 408, "timeout")
    # A version: that instance_id, in that state.
    ok(flaps.start(app, m["id"]))
    version = go.decode("machine", ok(flaps.get(app, m["id"])))["instance_id"]
    r = ok(flaps.wait(app, m["id"], "started", version=version))
    assert path_of(r).endswith(f"/wait?state=started&timeout=60&version={version}")
    r = flaps.wait(app, m["id"], "started", timeout_s=1, version="01NOTTHISONE")
    fly_error(go, r, 408, "timeout")


def test_wait_from_event_id_is_refused(flaps: Flaps, go: GoDecoder, app: str) -> None:
    r = flaps.wait(app, "m", "started", from_event_id="01EVENT")
    assert "from_event_id=01EVENT" in path_of(r)
    fly_error(go, r, 422, "invalid_input", "from_event_id")


def test_a_machine_that_is_not_there(flaps: Flaps, go: GoDecoder, app: str) -> None:
    r = flaps.get(app, "nosuchmachine")
    fly_error(go, r, 404, "not_found")  # errors.Is(err, ErrFlapsNotFound): the 404
