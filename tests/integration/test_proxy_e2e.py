"""`souq proxy` as a process on a real cluster: HTTP by Host to an app's machines, scale from
zero inside the request, resume from suspend, autostop, and stops that lose no request."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from souq.compiled import compiled
from souq.model import MachineState
from souq.natsserver import free_port
from souq.testing import Cluster, ProxyProcess, auth_headers, wait_until
from tests.clusters import ClusterSpec
from tests.integration.images_harness import souq
from tests.integration.services_harness import app_name, edge_proxy
from tests.integration.services_harness import echo_config as config

CLUSTER = ClusterSpec("edge", regions={"mad": 2})


@pytest.fixture(scope="module")
def proxy(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with edge_proxy(cluster, tmp_path_factory) as p:
        yield p


def via(proxy: ProxyProcess, app: str, path: str = "/", **kw: object) -> httpx.Response:
    return httpx.get(proxy.url + path, headers={"Host": f"{app}.localhost"}, timeout=15, **kw)


def in_table(proxy: ProxyProcess, app: str) -> bool:
    """The proxy routes the app (a request that is not a 404)."""
    return via(proxy, app).status_code != 404


def test_requests_reach_the_apps_machines_by_host(cluster: Cluster, proxy: ProxyProcess) -> None:
    client = cluster.client()
    app = app_name("e")
    m = client.create_machine(app, "mad", config())
    r = wait_until(
        lambda: (r := via(proxy, app, "/hello?x=1")).status_code == 200 and r,
        message="the proxy to route the app",
    )
    got = r.json()
    assert got["machine_id"] == m.id and got["path"] == "/hello?x=1"
    headers = {k.lower(): v for k, v in got["headers"].items()}
    assert headers["x-forwarded-for"] == "127.0.0.1"
    assert headers["x-forwarded-proto"] == "http"
    assert "souq" in headers["via"]
    assert headers["x-request-id"] == r.headers["x-request-id"]
    client.destroy(app, m.id, force=True)


def test_the_proxy_says_whether_its_relay_runs_compiled(proxy: ProxyProcess) -> None:
    # `make test` builds the compiled modules (where a C compiler is): the processes run them.
    expected = "compiled" if "souq.proxy.downstream" in compiled() else "interpreted"
    assert f"(relay {expected})" in proxy.log_tail(100_000)


def test_an_unknown_app_is_a_json_404(proxy: ProxyProcess) -> None:
    r = via(proxy, "nosuchapp")
    assert r.status_code == 404
    assert r.json()["status"] == "app_not_found"
    assert "nosuchapp" in r.json()["error"]


def test_a_request_starts_a_stopped_machine_and_is_answered(
    cluster: Cluster, proxy: ProxyProcess
) -> None:
    client = cluster.client()
    app = app_name("e")
    m = client.create_machine(app, "mad", config())
    wait_until(lambda: via(proxy, app).status_code == 200, message="the app to be routed")
    client.stop(app, m.id)
    client.wait(app, m.id, MachineState.STOPPED)
    # Scale from zero: the request itself starts the machine and gets its answer.
    r = via(proxy, app)
    assert r.status_code == 200 and r.json()["machine_id"] == m.id
    assert client.get_machine(app, m.id).state == MachineState.STARTED
    decisions = httpx.get(
        proxy.admin_url + "/decisions", params={"app": app}, headers=auth_headers()
    ).json()
    assert any(d["kind"] == "wake" and d["machine_id"] == m.id for d in decisions)
    metrics = httpx.get(proxy.admin_url + "/metrics", headers=auth_headers()).text
    assert f'souq_proxy_wakeup_seconds_count{{app="{app}"}} 1.0' in metrics
    client.destroy(app, m.id, force=True)


def test_a_request_resumes_a_suspended_machine(cluster: Cluster, proxy: ProxyProcess) -> None:
    client = cluster.client()
    app = app_name("e")
    m = client.create_machine(app, "mad", config(autostop="suspend"))
    wait_until(lambda: via(proxy, app).status_code == 200, message="the app to be routed")
    client.suspend(app, m.id)
    wait_until(
        lambda: client.get_machine(app, m.id).state == MachineState.SUSPENDED,
        message="suspended",
    )
    r = via(proxy, app)
    assert r.status_code == 200 and r.json()["machine_id"] == m.id
    again = client.get_machine(app, m.id)
    assert again.state == MachineState.STARTED and again.pid == m.pid  # the same process
    client.destroy(app, m.id, force=True)


# One thread, HTTP/1.1: while the proxy keeps a connection to it alive, it accepts no other.
SINGLE_THREADED_APP = """
import os
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
HTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


def test_a_single_threaded_app_resumes_again_and_again(
    cluster: Cluster, proxy: ProxyProcess
) -> None:
    # Each wake-up that probed the resumed machine's port left one connection in its backlog,
    # which this app never accepts while the proxy's kept-alive connection is open: after a
    # few resumes the backlog was full and a request waited 10 s for a 503.
    client = cluster.client()
    app = app_name("e")
    m = client.create_machine(
        app,
        "mad",
        {**config(autostop="suspend"), "cmd": [sys.executable, "-c", SINGLE_THREADED_APP]},
    )
    wait_until(lambda: via(proxy, app).status_code == 200, message="the app to be routed")
    for _ in range(12):
        client.suspend(app, m.id)
        wait_until(
            lambda: any(
                b["state"] == "suspended"
                for b in httpx.get(
                    proxy.admin_url + "/backends", params={"app": app}, headers=auth_headers()
                ).json()
            ),
            message="the proxy to see it suspended",
        )
        r = httpx.get(proxy.url, headers={"Host": f"{app}.localhost"}, timeout=5)
        assert r.status_code == 200 and r.text == "ok"
    client.destroy(app, m.id, force=True)


def test_nothing_to_serve_is_a_json_503(cluster: Cluster, proxy: ProxyProcess) -> None:
    client = cluster.client()
    app = app_name("e")
    m = client.create_machine(app, "mad", config(autostart=False))
    wait_until(lambda: via(proxy, app).status_code == 200, message="the app to be routed")
    client.stop(app, m.id)
    client.wait(app, m.id, MachineState.STOPPED)
    r = wait_until(
        lambda: (r := via(proxy, app)).status_code == 503 and r, message="no machine to serve"
    )
    assert r.json()["status"] == "no_machines"
    client.destroy(app, m.id)


def test_a_stop_loses_no_request_of_a_stream(cluster: Cluster, proxy: ProxyProcess) -> None:
    client = cluster.client()
    app = app_name("e")
    a = client.create_machine(app, "mad", config())
    b = client.create_machine(app, "mad", config())
    wait_until(
        lambda: {via(proxy, app).json()["machine_id"] for _ in range(20)} == {a.id, b.id},
        message="both machines to take requests",
    )
    failures: list[str] = []
    answered: list[str] = []
    done = threading.Event()

    def stream() -> None:
        with httpx.Client(base_url=proxy.url, headers={"Host": f"{app}.localhost"}) as http:
            while not done.is_set():
                r = http.get("/", timeout=15)
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text}")
                else:
                    answered.append(r.json()["machine_id"])

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(answered) > 50, message="the stream to flow")
        client.stop(app, a.id)  # drains, then SIGINT
        client.wait(app, a.id, MachineState.STOPPED)
        seen = len(answered)
        wait_until(lambda: len(answered) > seen + 50, message="the stream to go on")
    finally:
        done.set()
        for t in threads:
            t.join()
    assert failures == []
    assert answered[-1] == b.id
    for mid in (a.id, b.id):
        client.destroy(app, mid, force=True)


def test_autostop_stops_idle_machines(cluster: Cluster, tmp_path: Path) -> None:
    with ProxyProcess(
        nats_url=cluster.nats.url,
        log_path=tmp_path / "proxy.log",
        extra_args=["--autostop-interval", "0.3"],
    ) as p:
        client = cluster.client()
        app = app_name("e")
        machines = [client.create_machine(app, "mad", config()) for _ in range(2)]
        for m in machines:
            client.wait(app, m.id, MachineState.STOPPED, timeout=30)
        decisions = httpx.get(
            p.admin_url + "/decisions", params={"app": app}, headers=auth_headers()
        ).json()
        assert sorted(d["machine_id"] for d in decisions if d["kind"] == "autostop") == sorted(
            m.id for m in machines
        )
        # The next request wakes one again.
        r = httpx.get(p.url, headers={"Host": f"{app}.localhost"}, timeout=15)
        assert r.status_code == 200
        for m in machines:
            client.destroy(app, m.id, force=True)


def test_a_raw_tcp_service_is_piped_as_it_is(cluster: Cluster, proxy: ProxyProcess) -> None:
    client = cluster.client()
    app = app_name("e")
    edge = free_port()
    m = client.create_machine(
        app,
        "mad",
        {
            **config(),
            "services": [{"internal_port": 8080, "ports": [{"port": edge, "handlers": []}]}],
        },
    )

    def over_tcp() -> dict[str, object] | None:
        # HTTP bytes through a raw pipe: nothing is added on the way (no X-Forwarded-For).
        try:
            r = httpx.get(f"http://127.0.0.1:{edge}/raw", timeout=2)
        except httpx.HTTPError:
            return None
        return dict(r.json()) if r.status_code == 200 else None

    got = wait_until(over_tcp, message="the app through its edge port")
    assert got["machine_id"] == m.id and got["path"] == "/raw"
    assert "X-Forwarded-For" not in got["headers"]
    client.destroy(app, m.id, force=True)


def test_a_request_right_after_a_create_waits_for_the_port(
    cluster: Cluster, proxy: ProxyProcess
) -> None:
    # The CLI answers once the machine is started; its server binds its port a second later.
    # The request goes at once (the proxy may not even have heard of the app yet) and is
    # answered by it, not refused.
    app = app_name("bind")
    script = f"sleep 1; exec {sys.executable} -m http.server $PORT"
    run = souq(
        cluster,
        *("machine", "run", "--app", app, "--region", "mad", "--cpus", "0.1"),
        *("--port", "8080", "--autostop", "stop", "--", "sh", "-c", script),
    )
    assert run.returncode == 0, run.stderr
    r = via(proxy, app)
    assert r.status_code == 200, r.text
    client = cluster.client()
    for m in client.list_machines(app):
        client.destroy(app, m.id, force=True)
