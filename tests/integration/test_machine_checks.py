"""Health checks run by the worker, on a real cluster: the machine record carries each check's
status, a wait for a healthy machine answers once every check passes (and times out naming the
failing check otherwise), and an update runs the new config's checks."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from souq.errors import SouqError
from souq.model.machine import CheckStatus, MachineState
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec

APP = "chk"
# Answers GET with the status in $STATUS (200 by default) on $PORT.
SERVER = """
import os
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(int(os.environ.get("STATUS", "200")))
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


CLUSTER = ClusterSpec("checks", regions={"mad": 1})


def served(status: int, **checks: dict[str, Any]) -> dict[str, Any]:
    return {
        "cmd": [sys.executable, "-c", SERVER],
        "env": {"STATUS": str(status)},
        "services": [{"internal_port": 8080}],
        "checks": checks,
    }


def statuses(
    cluster: Cluster,
    machine_id: str,
    want: dict[str, str],
    saying: dict[str, str] | None = None,
) -> dict[str, CheckStatus]:
    """The machine's checks once each has the status ``want`` gives it (and the checks named in
    ``saying`` an output with those words)."""
    with cluster.client() as client:

        def reached() -> dict[str, CheckStatus] | None:
            now = {c.name: c for c in client.get_machine(APP, machine_id).checks}
            if {n: c.status for n, c in now.items()} != want:
                return None
            said = all(words in now[n].output for n, words in (saying or {}).items())
            return now if said else None

        return wait_until(reached, timeout=30, message=f"checks {want}")


HTTP = {"type": "http", "port": 8080, "path": "/healthz", "interval": "0.2s", "timeout": "2s"}


def test_a_passing_check_makes_the_machine_healthy(cluster: Cluster) -> None:
    with cluster.client() as client:
        machine = client.create_machine(APP, "mad", served(200, alive=HTTP))
        healthy = client.wait(APP, machine.id, MachineState.STARTED, timeout=30, healthy=True)
        (check,) = healthy.checks
        assert (check.name, check.status, check.output) == ("alive", "passing", "OK")
        assert client.get_machine(APP, machine.id).checks[0].status == "passing"
        client.destroy(APP, machine.id, force=True)


def test_a_failing_check_is_critical_and_a_wait_for_health_says_why(cluster: Cluster) -> None:
    with cluster.client() as client:
        machine = client.create_machine(APP, "mad", served(503, alive=HTTP))
        statuses(cluster, machine.id, {"alive": "critical"})
        with pytest.raises(SouqError) as caught:
            client.wait(APP, machine.id, MachineState.STARTED, timeout=1, healthy=True)
        assert caught.value.status == "timeout"
        assert "check alive is critical: GET /healthz answered 503" in caught.value.message
        (check,) = client.get_machine(APP, machine.id).checks
        assert check.status == "critical"
        # An update to a config whose check passes: the new checks run, and it is healthy.
        fixed = served(200, alive=HTTP)
        client.update(APP, machine.id, fixed)
        healthy = client.wait(APP, machine.id, MachineState.STARTED, timeout=30, healthy=True)
        assert [c.status for c in healthy.checks] == ["passing"]
        client.destroy(APP, machine.id, force=True)


def test_tcp_checks_and_the_grace_period(cluster: Cluster) -> None:
    closed = {"type": "tcp", "port": 9999, "interval": "0.2s", "timeout": "1s"}
    graced = {**HTTP, "grace_period": "1h"}
    with cluster.client() as client:
        config = served(500, open={"type": "tcp", "port": 8080, "interval": "0.2s"}, graced=graced)
        config["services"].append({"internal_port": 9999})
        config["checks"]["closed"] = closed
        machine = client.create_machine(APP, "mad", config)
        seen = statuses(
            cluster,
            machine.id,
            {"open": "passing", "closed": "critical", "graced": "warning"},
            saying={"graced": "answered 500"},  # (before the app listens: refused, in grace)
        )
        with pytest.raises(SouqError):
            client.wait(APP, machine.id, MachineState.STARTED, timeout=1, healthy=True)
        assert "ConnectionRefusedError" in seen["closed"].output
        # Failing (500), but within its grace period: a warning, not critical.
        assert "answered 500" in seen["graced"].output and "grace" in seen["graced"].output
        client.stop(APP, machine.id)
        stopped = client.wait(APP, machine.id, MachineState.STOPPED, timeout=30)
        assert stopped.checks == []  # a machine that is not started has no checks
        client.destroy(APP, machine.id, force=True)
