"""Exec, ps, metadata and cordon on a real cluster, sent exactly as Fly's Go client (``flaps``)
sends them: the paths, bodies and headers of ``Exec``, ``GetProcesses``, ``SetMetadata``,
``GetMetadata``, ``DeleteMetadata``, ``Cordon`` and ``Uncordon``; the answers checked for the
JSON types Go decodes them into."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from souq.drivers import sandbox
from souq.model import Machine, MachineState
from souq.testing import Cluster, ProxyProcess, auth_headers, wait_until
from tests.clusters import ClusterSpec
from tests.integration.services_harness import app_name, echo_config, edge_proxy, visible_echo

INT32 = 2**31
FLY_HEADERS = {"Content-Type": "application/json", "User-Agent": "fly-go/test"}


CLUSTER = ClusterSpec("tools", regions={"mad": 2})


@pytest.fixture(scope="module")
def proxy(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with edge_proxy(cluster, tmp_path_factory) as p:
        yield p


def flaps(
    cluster: Cluster, method: str, app: str, path: str, body: Any = None, **headers: str
) -> httpx.Response:
    """One request as flaps sends it: ``/v1/apps/{app}/machines{path}``, JSON when a body."""
    sent = {**auth_headers(), **FLY_HEADERS, **headers}
    if body is None:
        sent.pop("Content-Type")
    return httpx.request(
        method,
        f"{cluster.api_url}/v1/apps/{app}/machines{path}",
        json=body,
        headers=sent,
        timeout=30,
    )


def started(cluster: Cluster, app: str, **config: Any) -> Machine:
    with cluster.client() as client:
        m = client.create_machine(app, "mad", {**echo_config(), **config})
        return client.wait(app, m.id, MachineState.STARTED, timeout=20)


def status(pid: int, key: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return line.split()[1]
    raise AssertionError(key)


def is_int(value: object, *, unsigned: bool = False) -> bool:
    return type(value) is int and (not unsigned or value >= 0)


def test_exec_runs_in_the_machines_context(cluster: Cluster) -> None:
    app = app_name("x")
    m = started(cluster, app)
    assert m.pid is not None and m.address is not None
    script = "echo $PORT $SOUQ_MACHINE_ID; pwd; id -u; cat /proc/self/cgroup | sort; cat"
    r = flaps(cluster, "POST", app, f"/{m.id}/exec", {"cmd": f"sh -c '{script}'", "stdin": "fed\n"})
    assert r.status_code == 200, r.text
    got = r.json()
    assert is_int(got["exit_code"]) and got["exit_code"] == 0
    assert isinstance(got["stdout"], str) and isinstance(got["stderr"], str)
    lines = got["stdout"].splitlines()
    assert lines[0] == f"{m.address.port_for(8080)} {m.id}"
    assert lines[1] == str(Path(f"/proc/{m.pid}/cwd").resolve())
    assert lines[2] == status(m.pid, "Uid")
    own = sorted(Path(f"/proc/{m.pid}/cgroup").read_text().splitlines())
    assert lines[3 : 3 + len(own)] == own  # the machine's cgroup: its limits hold
    assert lines[-1] == "fed"


MOVED = "echo here > marker; cd /; exec sleep 600"  # a file of its own, then elsewhere


@pytest.mark.parametrize("driver", ["exec", "sandbox"])
def test_exec_runs_in_the_machines_working_directory_wherever_its_process_went(
    cluster: Cluster, driver: str
) -> None:
    if driver == "sandbox" and not sandbox.available():
        pytest.skip("bubblewrap cannot run here")
    app = app_name("w")
    config = {"cmd": ["sh", "-c", MOVED], "driver": driver, "guest": {"cpus": 0.1, "memory_mb": 64}}
    m = started(cluster, app, **config)
    agent = next(a for a in cluster.agents if a.worker_id == m.worker_id)
    own = agent.data_dir / "machines" / m.id  # its directory on the host
    assert m.pid is not None
    watched = psutil.Process(m.pid)  # its process, or its sandbox's bwrap

    def moved() -> bool:  # its shell went to / and then became sleep
        return any(p.name() == "sleep" for p in [watched, *watched.children(recursive=True)])

    wait_until(moved, message="the machine's command to move to / and sleep")
    r = flaps(cluster, "POST", app, f"/{m.id}/exec", {"cmd": "sh -c 'pwd; cat marker'"})
    assert r.status_code == 200, r.text
    seen = r.json()["stdout"].splitlines()
    assert seen == [str(own) if driver == "exec" else sandbox.WORKDIR, "here"], r.json()


def test_exec_right_after_the_start_finds_the_machine_as_it_runs(cluster: Cluster) -> None:
    """souq-waiter reports a machine's process (and it is started) as soon as it is forked:
    an exec at once must still find it in its own directory, environment and user."""
    app = app_name("a")
    for _ in range(5):
        config = {**echo_config(), "env": {"MINE": "yes"}}
        with cluster.client() as client:
            m = client.create_machine(app, "mad", config)
        assert m.state is MachineState.STARTED, m.state
        agent = next(a for a in cluster.agents if a.worker_id == m.worker_id)
        r = flaps(cluster, "POST", app, f"/{m.id}/exec", {"cmd": "sh -c 'pwd; echo $MINE; id -u'"})
        assert r.status_code == 200, r.text
        uid = status(m.pid, "Uid") if m.pid is not None else None
        assert r.json()["stdout"].split() == [str(agent.data_dir / "machines" / m.id), "yes", uid]
        flaps(cluster, "DELETE", app, f"/{m.id}?force=true")


def test_exec_exit_codes_argv_and_timeouts(cluster: Cluster) -> None:
    app = app_name("x")
    m = started(cluster, app)
    r = flaps(cluster, "POST", app, f"/{m.id}/exec", {"cmd": "sh -c 'echo oops >&2; exit 3'"})
    assert r.status_code == 200 and r.json() == {
        "exit_code": 3,
        "stdout": "",
        "stderr": "oops\n",
        "truncated": False,
    }
    r = flaps(cluster, "POST", app, f"/{m.id}/exec", {"command": ["echo", "a  b"]})
    assert r.json()["stdout"] == "a  b\n"
    r = flaps(cluster, "POST", app, f"/{m.id}/exec", {"cmd": "no-such-program-here"})
    assert r.status_code == 200 and r.json()["exit_code"] == 127
    r = flaps(cluster, "POST", app, f"/{m.id}/exec", {"cmd": "sleep 30", "timeout": 1})
    assert r.status_code == 408, r.text
    assert r.json()["status"] == "timeout" and "1s" in r.json()["error"]
    r = flaps(cluster, "POST", app, f"/{m.id}/exec", {"cmd": "echo 'unclosed"})
    assert r.status_code == 422 and "cmd" in r.json()["error"]
    r = flaps(cluster, "POST", app, f"/{m.id}/exec", {"cmd": "true", "command": ["true"]})
    assert r.status_code == 422
    r = flaps(cluster, "POST", app, f"/{m.id}/exec", {"cmd": "seq 1 200000"})
    assert r.json()["truncated"] is True and len(r.json()["stdout"]) <= 256 * 1024 + 64
    with cluster.client() as client:
        client.stop(app, m.id)
        client.wait(app, m.id, MachineState.STOPPED, timeout=20)
    r = flaps(cluster, "POST", app, f"/{m.id}/exec", {"cmd": "true"})
    assert r.status_code == 409 and r.json()["status"] == "machine_not_started"
    assert "stopped" in r.json()["error"]
    assert f"souq machine start --app {app} {m.id}" in r.json()["hint"]  # a command that runs
    with cluster.client() as client:
        client.destroy(app, m.id, force=True)
        client.wait(app, m.id, MachineState.DESTROYED, timeout=20)
    r = flaps(cluster, "POST", app, f"/{m.id}/exec", {"cmd": "true"})
    assert r.status_code == 409 and "destroyed" in r.json()["error"], r.text
    assert r.json()["hint"] == "it is gone: create a new machine"  # not a start that fails


def test_ps_lists_the_machines_processes_as_go_decodes_them(cluster: Cluster) -> None:
    app = app_name("x")
    m = started(cluster, app)
    assert m.pid is not None and m.address is not None
    port = m.address.port_for(8080)

    def listening() -> list[dict[str, Any]] | None:
        rows: list[dict[str, Any]] = flaps(cluster, "GET", app, f"/{m.id}/ps").json()
        return rows if rows[0]["listen_sockets"] else None

    rows = wait_until(listening, message="the machine to listen")
    assert rows[0]["pid"] == m.pid
    for row in rows:
        assert is_int(row["pid"]) and 0 < row["pid"] < INT32
        for key in ("stime", "rtime", "cpu", "rss"):
            assert is_int(row[key], unsigned=True), (key, row)
        assert isinstance(row["command"], str) and isinstance(row["directory"], str)
    assert "echo_app.py" in rows[0]["command"]
    assert {"proto": "tcp", "address": f"127.0.0.1:{port}"} in rows[0]["listen_sockets"]


def test_metadata_is_set_read_and_deleted_without_a_restart(cluster: Cluster) -> None:
    app = app_name("x")
    m = started(cluster, app, metadata={"team": "a"})
    r = flaps(cluster, "POST", app, f"/{m.id}/metadata/fly_process_group", {"value": "web"})
    assert r.status_code == 204 and r.content == b""
    r = flaps(cluster, "GET", app, f"/{m.id}/metadata")
    assert r.status_code == 200 and r.json() == {"team": "a", "fly_process_group": "web"}
    with cluster.client() as client:
        after = client.get_machine(app, m.id)
    assert (after.pid, after.instance_id, after.state) == (m.pid, m.instance_id, m.state)
    assert any(e.type == "metadata" for e in after.events)
    r = flaps(cluster, "DELETE", app, f"/{m.id}/metadata/team")
    assert r.status_code == 204
    assert flaps(cluster, "GET", app, f"/{m.id}/metadata").json() == {"fly_process_group": "web"}
    r = flaps(cluster, "POST", app, f"/{m.id}/metadata/k", {"value": 3})
    assert r.status_code == 422 and "value" in r.json()["error"]
    r = flaps(cluster, "GET", app, "/nosuchmachine/metadata")
    assert r.status_code == 404


def test_a_cordoned_machine_gets_no_requests_until_uncordoned(
    cluster: Cluster, proxy: ProxyProcess
) -> None:
    app = app_name("c")
    one, two = started(cluster, app), started(cluster, app)

    def answered(n: int) -> collections.Counter[str]:
        host = {"Host": f"{app}.localhost"}
        return collections.Counter(
            httpx.get(proxy.url + "/", headers=host, timeout=15).json()["machine_id"]
            for _ in range(n)
        )

    wait_until(lambda: len(answered(20)) == 2, message="both machines to serve")
    r = flaps(cluster, "POST", app, f"/{one.id}/cordon", **{"fly-machine-lease-nonce": "n1"})
    assert r.status_code == 200, r.text
    assert r.json()["cordoned"] is True and r.json()["state"] == "started"
    wait_until(lambda: set(answered(10)) == {two.id}, message="the cordon to reach the proxy")
    assert set(answered(40)) == {two.id}
    r = flaps(cluster, "GET", app, f"/{one.id}")
    assert r.json()["cordoned"] is True and r.json()["pid"] == one.pid
    r = flaps(cluster, "POST", app, f"/{one.id}/uncordon")
    assert r.status_code == 200 and r.json()["cordoned"] is False
    wait_until(lambda: one.id in answered(20), message="the machine back in rotation")


def test_cordon_and_metadata_survive_an_agent_restart(cluster: Cluster) -> None:
    app = app_name("d")
    m = started(cluster, app)
    assert flaps(cluster, "POST", app, f"/{m.id}/cordon").status_code == 200
    assert flaps(cluster, "POST", app, f"/{m.id}/metadata/k", {"value": "v"}).status_code == 204
    agent = next(a for a in cluster.agents if a.worker_id == m.worker_id)
    agent.stop()
    agent.start()
    cluster.wait_for_workers()
    r = flaps(cluster, "GET", app, f"/{m.id}")
    assert r.json()["cordoned"] is True and r.json()["config"]["metadata"] == {"k": "v"}
    assert r.json()["instance_id"] == m.instance_id, r.json()["events"][:3]


def test_the_cli_execs_lists_sets_metadata_and_cordons(cluster: Cluster) -> None:
    from tests.integration.images_harness import souq

    app = app_name("l")
    m = started(cluster, app)
    run = souq(cluster, "machine", "exec", "--app", app, m.id, "--", "sh", "-c", "echo hi; exit 4")
    assert (run.returncode, run.stdout) == (4, "hi\n"), run.stderr
    run = souq(cluster, "machine", "ps", m.id, "--app", app)
    assert run.returncode == 0 and "echo_app.py" in run.stdout, run.stderr
    run = souq(cluster, "machine", "metadata", m.id, "a=1", "b=2", "a-", "--app", app)
    assert (run.returncode, run.stdout) == (0, "b=2\n"), run.stderr
    run = souq(cluster, "machine", "cordon", m.id, "--app", app)
    assert run.stdout.split() == [m.id, "started", "cordoned"], run.stderr
    run = souq(cluster, "machine", "uncordon", m.id, "--app", app, "--json")
    assert run.returncode == 0 and '"cordoned": false' in run.stdout
    with cluster.client() as client:
        client.stop(app, m.id)
        client.wait(app, m.id, MachineState.STOPPED, timeout=20)
    run = souq(cluster, "machine", "exec", "--app", app, m.id, "--", "true")
    assert run.returncode == 1 and "started machine" in run.stderr


@pytest.mark.skipif(not sandbox.available(), reason="bubblewrap cannot run here")
def test_exec_and_ps_enter_a_sandboxed_machine(cluster: Cluster) -> None:
    app = app_name("s")
    m = started(cluster, app, driver="sandbox", cmd=visible_echo())
    assert m.address is not None
    port = m.address.port_for(8080)
    script = "hostname; echo $PORT; echo $$; pwd"
    r = flaps(cluster, "POST", app, f"/{m.id}/exec", {"cmd": f"sh -c '{script}'"})
    assert r.status_code == 200, r.text
    host, port_seen, pid, cwd = r.json()["stdout"].split()
    assert (host, port_seen, cwd) == ("sandbox", str(port), sandbox.WORKDIR)
    assert int(pid) < 20  # a pid of the machine's own namespace

    def listening() -> list[dict[str, Any]] | None:
        rows: list[dict[str, Any]] = flaps(cluster, "GET", app, f"/{m.id}/ps").json()
        return rows if any(row["listen_sockets"] for row in rows) else None

    rows = wait_until(listening, message="the sandboxed machine to listen")
    assert rows[0]["pid"] == 1 and "bwrap" in rows[0]["command"]  # its init, as it sees it
    app_row = rows[1]  # the machine's command, pid 2
    assert app_row["pid"] == 2 and app_row["command"].endswith("echo_app.py")
    assert app_row["directory"] == sandbox.WORKDIR
    assert {"proto": "tcp", "address": f"127.0.0.1:{port}"} in app_row["listen_sockets"]
