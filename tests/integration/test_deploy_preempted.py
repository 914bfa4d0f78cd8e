"""A deploy's served machine displaced by a create of a higher priority class is re-placed by
``souq scale reconcile`` (run once, or watching the app's events): a new machine on another
worker, the displaced one destroyed, and the deploy's record says why (a real cluster, the
CLI); and, with a machine of its group at rest, a ``souq proxy`` starts that one in its place
at once, its decisions saying why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import httpx

from souq.model.machine import Machine, MachineState
from souq.testing import Cluster, ProxyProcess, auth_headers, wait_until
from tests.clusters import ClusterSpec
from tests.integration.images_harness import SOUQ, souq

APP = "served"
TOML = f"""\
app = "{APP}"
primary_region = "mad"
[build]
dir = "."
[processes]
app = "sleep 600"
[http_service]
internal_port = 8080
[[vm]]
cpus = 1
memory_mb = 64
[regions]
mad = 1
"""


CLUSTER = ClusterSpec("preempted", regions={"mad": 2}, cpus=1, memory_mb=1024)


def toml(app: str) -> str:
    return TOML.replace(f'app = "{APP}"', f'app = "{app}"', 1)


def deploy(cluster: Cluster, app: str, root: Path, count: int = 1) -> None:
    """Deploy ``app``: ``count`` machines of a served group."""
    (root / "souq.toml").write_text(toml(app).replace("mad = 1", f"mad = {count}"))
    run = souq(cluster, "deploy", "--config", str(root / "souq.toml"), "--json")
    assert run.returncode == 0, run.stderr


def preempt(cluster: Cluster, app: str) -> tuple[Machine, Machine]:
    """Displace the app's started machine with a reserved one pinned to its worker: (the
    displaced machine, the one that took its room)."""
    with cluster.client() as client:
        (old,) = [m for m in client.list_machines(app) if m.state is MachineState.STARTED]
        taker = client.create_machine(
            f"prod-{app}",
            "mad",
            {
                "cmd": ["sleep", "600"],
                "guest": {"cpus": 1, "memory_mb": 64},
                "priority_class": "reserved",
                "constraints": [
                    {"attribute": "worker.id", "operator": "=", "value": old.worker_id}
                ],
            },
        )
    assert taker.placement is not None
    assert [v.machine_id for v in taker.placement.preempted] == [old.id]
    return old, taker


def wait_replaced(cluster: Cluster, app: str, old: Machine) -> Machine:
    """The app's machine that replaced ``old``, once ``old`` is destroyed."""
    with cluster.client() as client:

        def replaced() -> bool:
            states = {m.id: m.state for m in client.list_machines(app)}
            return states.get(old.id, MachineState.DESTROYED) is MachineState.DESTROYED

        wait_until(replaced, timeout=60, message="the displaced machine to be destroyed")
        (new,) = [m for m in client.list_machines(app) if m.state is MachineState.STARTED]
    assert new.id != old.id and new.worker_id != old.worker_id
    assert new.config.metadata["souq_process_group"] == "app"
    return new


def clean(cluster: Cluster, *apps: str) -> None:
    with cluster.client() as client:
        for app in apps:
            for machine in client.list_machines(app):
                client.destroy(app, machine.id, force=True)


def test_a_preempted_served_machine_is_replaced_elsewhere(cluster: Cluster, tmp_path: Path) -> None:
    app = APP
    deploy(cluster, app, tmp_path)
    old, taker = preempt(cluster, app)
    with cluster.client() as client:
        client.wait(app, old.id, "stopped", timeout=30)
    run = souq(cluster, "scale", "reconcile", "--app", app, "--json")
    assert run.returncode == 0, run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    said = " / ".join(e["message"] for e in events)
    assert f"in the place of machine {old.id}, preempted" in said
    assert f"machine {old.id} destroyed (replaced: preempted by machine {taker.id}" in said
    wait_replaced(cluster, app, old)
    with cluster.client() as client:
        (release, *_) = client.releases(app)
    assert str(release.state) == "complete" and "reconcile" in release.description
    # At its counts again: a second reconcile changes nothing.
    again = souq(cluster, "scale", "reconcile", "--app", app, "--json")
    assert again.returncode == 0, again.stderr
    assert "nothing changed" in again.stdout
    clean(cluster, app, f"prod-{app}")


def test_a_watching_reconcile_replaces_it_as_the_preemption_happens(
    cluster: Cluster, tmp_path: Path
) -> None:
    app = "watched"
    deploy(cluster, app, tmp_path)
    env = {**os.environ, "SOUQ_API": cluster.api_url}
    args = [SOUQ, "scale", "reconcile", "--app", app, "--watch", "--json"]
    watcher = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    out = watcher.stdout
    assert out is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(out.readline, "")))
    reader.start()
    try:
        wait_until(lambda: any("nothing changed" in line for line in lines), message="reconcile")
        old, taker = preempt(cluster, app)
        new = wait_replaced(cluster, app, old)
        said = " / ".join(json.loads(line)["message"] for line in lines if line.strip())
        assert f"machine {new.id} created (in the place of machine {old.id}, preempted)" in said
        assert f"preempted by machine {taker.id}" in said
    finally:
        watcher.send_signal(signal.SIGINT)
        try:
            code = watcher.wait(timeout=20)
        except subprocess.TimeoutExpired:
            watcher.kill()
            code = watcher.wait()
        reader.join(timeout=10)
        clean(cluster, app, f"prod-{app}")
    assert code == 0  # interrupted, the watch ends cleanly


def test_a_proxy_starts_a_machine_of_its_group_at_rest_in_a_preempted_ones_place(
    cluster: Cluster, tmp_path: Path
) -> None:
    app = "atrest"
    deploy(cluster, app, tmp_path, count=2)  # one machine on each worker (1 cpu each)
    with cluster.client() as client:
        first, second = sorted(client.list_machines(app), key=lambda m: m.id)
        client.stop(app, second.id)  # at rest, holding its room on its worker
        client.wait(app, second.id, "stopped", timeout=30)
    proxy = ProxyProcess(
        nats_url=cluster.nats.url,
        log_path=tmp_path / "proxy.log",
        extra_args=["--autostop-interval", "3600"],
    )
    with proxy:

        def decisions() -> list[dict[str, str]]:
            answer = httpx.get(
                proxy.admin_url + "/decisions", params={"app": app}, headers=auth_headers()
            )
            return [d for d in answer.json() if d["kind"] == "failover"]

        def known() -> bool:
            answer = httpx.get(proxy.admin_url + "/backends", headers=auth_headers())
            return second.id in answer.text

        wait_until(known, timeout=30, message="the proxy to know the machine at rest")
        old, _ = preempt(cluster, app)
        assert old.id == first.id
        with cluster.client() as client:
            client.wait(app, second.id, "started", timeout=30)
            assert client.get_machine(app, first.id).state in (
                MachineState.STOPPING,
                MachineState.STOPPED,
            )
        [said] = wait_until(decisions, timeout=30, message="the failover's decision")
        assert said["machine_id"] == second.id
        assert said["reason"] == (
            f"machine {first.id} was preempted: started machine {second.id} of its group in "
            "its place"
        )
        # Nothing else at rest: the next preemption is recorded as left to a deploy.
        again, _ = preempt(cluster, app)
        assert again.id == second.id

        def told() -> bool:
            return any("no machine of its group at rest" in d["reason"] for d in decisions())

        wait_until(told, timeout=30, message="the decision that nothing was at rest")
    clean(cluster, app, f"prod-{app}")
