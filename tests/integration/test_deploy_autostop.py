"""Deploys of an app the proxy autostops (`auto_stop_machines = "stop"`, `min_machines_running =
0`), through a real `souq proxy` whose autostop runs every second, under traffic: a failed deploy
never takes the app offline (the machines at rest are updated first, a lease never blocks a
wake-up), and autostop never stops a machine a deploy is waiting on."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from souq.model.machine import Machine, MachineState
from souq.testing import Cluster, ProxyProcess, auth_headers, wait_until
from tests.clusters import ClusterSpec
from tests.integration.images_harness import souq
from tests.integration.test_deploy import SERVER
from tests.integration.test_deploy_traffic import Traffic

APP = "shop"  # the name Traffic sends requests for


def toml(greeting: str, *, count: int = 3, status: int = 200, delay: float = 0) -> str:
    return f"""\
app = "{APP}"
primary_region = "mad"

[build]
dir = "."

[env]
GREETING = "{greeting}"
STATUS = "{status}"
DELAY = "{delay}"

[processes]
app = "{sys.executable} server.py"

[http_service]
internal_port = 8080
auto_stop_machines = "stop"
auto_start_machines = true
min_machines_running = 0
  [[http_service.checks]]
  path = "/healthz"
  interval = "0.2s"
  timeout = "2s"

[[vm]]
cpus = 0.25
memory_mb = 64

[deploy]
strategy = "rolling"
max_unavailable = 1
wait_timeout = "{"6s" if status != 200 else "60s"}"

[regions]
mad = {count}
"""


CLUSTER = ClusterSpec("deploy-autostop", regions={"mad": 2}, cpus=2, memory_mb=2048)


@pytest.fixture(scope="module")
def proxy(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with ProxyProcess(
        nats_url=cluster.nats.url,
        log_path=tmp_path_factory.mktemp("proxy") / "proxy.log",
        extra_args=["--autostop-interval", "1"],
    ) as p:
        yield p


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shop")
    (root / "server.py").write_text(SERVER)
    return root


def deploy(cluster: Cluster, source: Path, text: str) -> tuple[int, str]:
    (source / "souq.toml").write_text(text)
    run = souq(cluster, "deploy", "--config", str(source / "souq.toml"), "--json")
    return run.returncode, run.stdout + run.stderr


def machines(cluster: Cluster) -> list[Machine]:
    with cluster.client() as client:
        return [
            m
            for m in client.list_machines(APP)
            if m.state not in (MachineState.DESTROYING, MachineState.DESTROYED)
        ]


def states(cluster: Cluster) -> list[str]:
    return sorted(str(m.state) for m in machines(cluster))


def test_a_failed_deploy_keeps_an_autostopped_app_serving(
    cluster: Cluster, proxy: ProxyProcess, source: Path
) -> None:
    code, said = deploy(cluster, source, toml("one"))
    assert code == 0, said
    with Traffic(proxy) as traffic:
        # Light traffic: autostop brings the app down to the one machine the load needs.
        wait_until(
            lambda: states(cluster) == ["started", "stopped", "stopped"],
            timeout=60,
            message="autostop to stop two of the three machines",
        )
        served = traffic.ok
        # A release whose check fails: it fails on a machine at rest, updated first, while the
        # started one goes on serving the old release; the two at rest are at rest again.
        code, said = deploy(cluster, source, toml("two", status=500))
        assert code == 1, said
        assert "check http-0 is critical" in said
        wait_until(lambda: traffic.ok > served + 20, message="traffic to flow after the deploy")
    assert traffic.failures == []
    after = machines(cluster)
    assert {m.config.env["GREETING"] for m in after} == {"one"}  # rolled back everywhere
    assert sorted(str(m.state) for m in after).count("started") >= 1


def test_a_lease_does_not_block_a_wake_up(
    cluster: Cluster, proxy: ProxyProcess, source: Path
) -> None:
    # No traffic: autostop stops every machine (min_machines_running = 0).
    wait_until(
        lambda: states(cluster) == ["stopped"] * 3, timeout=60, message="every machine stopped"
    )
    outcome: list[tuple[int, str]] = []
    failing = threading.Thread(
        target=lambda: outcome.append(deploy(cluster, source, toml("bad", status=500)))
    )
    failing.start()
    try:
        # While the deploy holds every machine's lease and waits on the one it updated, a
        # request wakes one of the others (the lease is the deploy's, not the proxy's).
        wait_until(
            lambda: any(
                m.config.env["GREETING"] == "bad" and m.state is MachineState.STARTED
                for m in machines(cluster)
            ),
            timeout=60,
            message="the deploy to start a machine with the failing release",
        )
        with httpx.Client(base_url=proxy.url, headers={"Host": f"{APP}.localhost"}) as http:
            answer = http.get("/", timeout=30)
        assert (answer.status_code, answer.text) == (200, "one")
    finally:
        failing.join(timeout=120)
    [(code, said)] = outcome
    assert code == 1, said


def test_autostop_does_not_stop_a_machine_a_deploy_waits_on(
    cluster: Cluster, proxy: ProxyProcess, source: Path
) -> None:
    # A release that starts slowly (it listens after 2 s, its first check passes after that),
    # and one more machine: autostop (every second) must not stop any machine before its
    # checks pass, nor right after, while the deploy is waiting to see it healthy.
    with Traffic(proxy) as traffic:
        code, said = deploy(cluster, source, toml("three", count=4, delay=2))
        assert code == 0, said
    assert traffic.failures == []
    now = machines(cluster)
    assert len(now) == 4
    assert {m.config.env["GREETING"] for m in now} == {"three"}
    decisions = httpx.get(
        proxy.admin_url + "/decisions", params={"app": APP}, headers=auth_headers()
    ).json()
    assert any(d["kind"] == "autostop" for d in decisions)  # autostop ran all along
