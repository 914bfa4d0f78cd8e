"""`souq deploy` and friends on a real cluster (nats-server with JetStream, agents in two
regions, a broker), driven through the CLI as a user drives them: releases, rolling updates in
place, canary, blue-green, a failing release rolled back everywhere, a concurrent deploy refused,
rollback and scale."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from souq.errors import NotFound
from souq.model.machine import Machine, MachineState
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec
from tests.integration.images_harness import souq

APP = "shop"
SERVER = """\
import os, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
time.sleep(float(os.environ.get("DELAY", "0")))  # a slow start: its first check passes late
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        code = int(os.environ.get("STATUS", "200")) if self.path == "/healthz" else 200
        body = os.environ.get("GREETING", "").encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


def toml(greeting: str, *, status: int = 200, strategy: str = "rolling", wait: str = "30s") -> str:
    return f"""\
app = "{APP}"
primary_region = "mad"

[build]
dir = "."

[env]
GREETING = "{greeting}"
STATUS = "{status}"

[processes]
app = "{sys.executable} server.py"

[http_service]
internal_port = 8080
  [[http_service.checks]]
  path = "/healthz"
  interval = "0.2s"
  timeout = "2s"

[[vm]]
cpus = 0.5
memory_mb = 64

[deploy]
strategy = "{strategy}"
max_unavailable = 1
wait_timeout = "{wait}"

[regions]
mad = 2
syd = 1
"""


CLUSTER = ClusterSpec("deploy", regions={"mad": 2, "syd": 1}, cpus=4, memory_mb=2048)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shop")
    (root / "server.py").write_text(SERVER)
    return root


def deploy(cluster: Cluster, source: Path, text: str, *extra: str) -> tuple[int, str, str]:
    (source / "souq.toml").write_text(text)
    run = souq(cluster, "deploy", "--config", str(source / "souq.toml"), "--json", *extra)
    return run.returncode, run.stdout, run.stderr


def machines(cluster: Cluster) -> list[Machine]:
    with cluster.client() as client:
        return sorted(client.list_machines(APP), key=lambda m: m.id)


def workers_in(cluster: Cluster, region: str) -> list[str]:
    """The workers of the app's live machines in ``region``, one a machine."""
    return sorted(
        m.worker_id
        for m in machines(cluster)
        if m.region == region and m.state not in (MachineState.DESTROYING, MachineState.DESTROYED)
    )


def live(cluster: Cluster) -> dict[str, tuple[str, str, str]]:
    """Each machine: (region, release, greeting its config gives)."""
    return {
        m.id: (m.region, m.config.metadata["souq_release"], m.config.env["GREETING"])
        for m in machines(cluster)
        if m.state not in (MachineState.DESTROYING, MachineState.DESTROYED)
    }


def test_deploys_roll_out_fail_and_roll_back_as_flyctl_users_expect(
    cluster: Cluster, source: Path
) -> None:
    # v1: three machines, two in mad and one in syd, each healthy.
    code, out, err = deploy(cluster, source, toml("one"))
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert events[0]["kind"] == "release" and events[-1]["kind"] == "done"
    assert sum(1 for e in events if e["kind"] == "healthy") == 3
    first = live(cluster)
    assert sorted(r for r, _, _ in first.values()) == ["mad", "mad", "syd"]
    # [regions] names the counts; mad has two workers: one machine on each (a lost worker is
    # not the region lost), though the quotes of one deploy are taken at once.
    assert len(set(workers_in(cluster, "mad"))) == 2
    assert {(rel, g) for _, rel, g in first.values()} == {("1", "one")}
    assert all(m.checks and m.checks[0].status == "passing" for m in machines(cluster))
    assert all(m.config.metadata["souq_process_group"] == "app" for m in machines(cluster))

    # v2, rolling: the same machines, updated in place, one at a time.
    code, out, err = deploy(cluster, source, toml("two"))
    assert code == 0, err
    second = live(cluster)
    assert set(second) == set(first)
    assert {(rel, g) for _, rel, g in second.values()} == {("2", "two")}
    phases = [e["phase"] for e in map(json.loads, out.splitlines()) if e["kind"] == "phase"]
    assert phases == [
        "rolling app in mad (1/2)",
        "rolling app in mad (2/2)",
        "rolling app in syd (1/1)",
    ]

    # v3 fails its health check: it is rolled back everywhere, and the error says where.
    code, out, err = deploy(cluster, source, toml("three", status=500, wait="2s"))
    assert code != 0
    assert "release v3 failed (phase rolling app in mad (1/2), region mad, machine" in err
    assert "check http-0 is critical: GET /healthz answered 500" in err
    assert "rolled back" in err
    assert live(cluster) == second  # every machine back on v2's config
    with cluster.client() as client:
        for m in machines(cluster):
            client.wait(APP, m.id, "started", timeout=30, healthy=True)
        history = {r.version: r for r in client.releases(APP)}
    assert [str(history[v].state) for v in (1, 2, 3)] == ["complete", "complete", "failed"]
    assert "http-0" in history[3].reason

    # Another deploy under way (it holds a lease): this one fails before changing anything.
    victim = machines(cluster)[0]
    with cluster.client() as client:
        lease = client.take_lease(APP, victim.id, ttl_s=60, description="deploy of shop v99")
        code, _, err = deploy(cluster, source, toml("four"))
        assert code != 0 and "another deploy is under way" in err and "v99" in err
        assert live(cluster) == second
        client.release_lease(APP, victim.id, lease.nonce)

    # Releases and status, as a person reads them.
    listed = souq(cluster, "releases", "--app", APP)
    assert listed.returncode == 0 and "v3" in listed.stdout and "failed" in listed.stdout
    status = souq(cluster, "status", "--app", APP)
    assert status.returncode == 0 and "1/1 passing" in status.stdout
    # A stopped machine's checks do not run: status does not call them passing.
    with cluster.client() as client:
        client.stop(APP, victim.id)
        client.wait(APP, victim.id, MachineState.STOPPED, timeout=30)
        status = souq(cluster, "status", "--app", APP)
        client.start(APP, victim.id)
        client.wait(APP, victim.id, MachineState.STARTED, timeout=30, healthy=True)
    assert status.returncode == 0, status.stderr
    (row,) = [line for line in status.stdout.splitlines() if line.startswith(victim.id)]
    assert "stopped" in row and "1 not running" in row and "passing" not in row
    assert status.stdout.count("1/1 passing") == 2  # the two others, started


def test_canary_bluegreen_rollback_and_scale(cluster: Cluster, source: Path) -> None:
    before = live(cluster)
    # Canary: a new machine proves the release first and goes; the others update in place.
    code, out, err = deploy(cluster, source, toml("canary", strategy="canary"))
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    canary = next(e for e in events if "canary created" in e["message"])
    assert any(e["message"] == f"machine {canary['machine_id']} destroyed" for e in events)
    after = live(cluster)
    assert set(after) == set(before)
    assert {g for _, _, g in after.values()} == {"canary"}

    # Blue-green: a whole new set, healthy, then the old one goes (it leaves rotation at once,
    # its worker stops and destroys it after).
    code, out, err = deploy(cluster, source, toml("green", strategy="bluegreen"))
    assert code == 0, err
    leaving = {m.id: m.state for m in machines(cluster) if m.id in after}
    assert set(leaving.values()) <= {MachineState.DESTROYING, MachineState.DESTROYED}
    wait_until(lambda: not set(live(cluster)) & set(after), timeout=60, message="blue gone")
    green = live(cluster)
    assert len(green) == 3 and {g for _, _, g in green.values()} == {"green"}

    # Blue-green's green set spreads too: mad's two machines on its two workers.
    assert len(set(workers_in(cluster, "mad"))) == 2

    # Rollback to the canary's release, written as `souq releases` shows it: a new release,
    # and the command says which one it restored.
    version = canary["version"]
    assert f"v{version}" in souq(cluster, "releases", "--app", APP).stdout
    run = souq(cluster, "rollback", "--app", APP, f"v{version}", "--strategy", "immediate")
    assert run.returncode == 0, run.stderr
    assert f"(rollback to v{version})" in run.stdout
    assert {g for _, _, g in live(cluster).values()} == {"canary"}
    bad = souq(cluster, "rollback", "--app", APP, "vnext")
    assert bad.returncode == 2 and "'vnext' is not a release version" in bad.stderr

    # Scale syd to 2: one more machine there, nothing else changes shape. syd has one worker:
    # its machines cannot spread, and the deploy says so.
    instances = {m.id: m.instance_id for m in machines(cluster) if m.id in live(cluster)}
    run = souq(cluster, "scale", "count", "2", "--app", APP, "--region", "syd")
    assert run.returncode == 0, run.stderr
    regions = sorted(r for r, _, _ in live(cluster).values())
    assert regions == ["mad", "mad", "syd", "syd"]
    # Only made one: no machine that stays (mad's, syd's first) was updated or restarted.
    now = {m.id: m.instance_id for m in machines(cluster)}
    assert {m: now[m] for m in instances} == instances
    assert (
        "syd cannot spread app: every worker there (1) already runs one of its machines"
        in run.stdout
    )


def test_a_bad_souq_toml_names_the_line(cluster: Cluster, source: Path) -> None:
    code, _, err = deploy(cluster, source, toml("x").replace("internal_port", "internal_prot"))
    assert code != 0
    assert "souq.toml:15: http_service.internal_prot: unknown key" in err


def test_dry_run_shows_the_plan_and_no_room_fails_before_any_change(
    cluster: Cluster, source: Path
) -> None:
    before = live(cluster)
    with cluster.client() as client:
        versions = len(client.releases(APP))
    text = toml("dry").replace("syd = 1", "syd = 3")
    (source / "souq.toml").write_text(text)
    run = souq(cluster, "deploy", "--config", str(source / "souq.toml"), "--dry-run", "--json")
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)
    creates = [r for r in rows if r["action"] == "create"]
    assert [r["region"] for r in creates] == ["syd"]  # syd has 2, wants 3
    assert creates[0]["worker_id"]  # where it would go: its capacity was held, then let go
    assert {r["machine_id"] for r in rows if r["action"] == "update"} == set(before)
    assert live(cluster) == before
    with cluster.client() as client:
        assert len(client.releases(APP)) == versions  # a dry run makes no release
    # 20 machines in syd cannot fit its one worker: the deploy fails before changing anything,
    # exits 3 (no capacity), and says why once.
    (source / "souq.toml").write_text(toml("huge").replace("syd = 1", "syd = 20"))
    run = souq(cluster, "deploy", "--config", str(source / "souq.toml"))
    assert run.returncode == 3, run.stderr
    said = run.stdout + run.stderr
    assert said.count("cannot start: no room for a new app machine in syd") == 1, said
    assert "nothing was changed" in run.stderr
    assert live(cluster) == before


def test_an_unknown_region_is_refused_before_anything_is_made(
    cluster: Cluster, source: Path
) -> None:
    before = live(cluster)
    with cluster.client() as client:
        versions = len(client.releases(APP))
    code, out, err = deploy(cluster, source, toml("x").replace("syd = 1", "syd = 1\nzzz = 1"))
    assert code == 1
    assert "[regions] names 'zzz', which no worker of the cluster is in" in err
    assert "known regions: mad, syd" in err
    assert out == ""  # no release, no lease, no quote: nothing to tell
    with cluster.client() as client:
        assert len(client.releases(APP)) == versions
        for m in machines(cluster):
            with pytest.raises(NotFound):
                client.lease(APP, m.id)
    assert live(cluster) == before


def test_a_group_without_services_gets_a_standby_on_another_worker(
    cluster: Cluster, tmp_path: Path
) -> None:
    text = """\
app = "jobs"
primary_region = "mad"
[build]
dir = "."
[env]
ROUND = "{round}"
[processes]
cron = "sh -c 'echo tick; exec sleep 600'"
"""
    for round_ in ("1", "2"):
        (tmp_path / "souq.toml").write_text(text.replace("{round}", round_))
        run = souq(cluster, "deploy", "--config", str(tmp_path / "souq.toml"), "--json")
        assert run.returncode == 0, run.stderr
        with cluster.client() as client:
            jobs = [m for m in client.list_machines("jobs") if str(m.state) != "destroyed"]
        (primary,) = [m for m in jobs if not m.config.standbys]
        (standby,) = [m for m in jobs if m.config.standbys]
        assert str(primary.state) == "started" and str(standby.state) == "stopped"
        assert standby.config.standbys == [primary.id]
        assert standby.worker_id != primary.worker_id  # another worker: it outlives the first
        assert {m.config.env["ROUND"] for m in jobs} == {round_}  # the standby is updated too
