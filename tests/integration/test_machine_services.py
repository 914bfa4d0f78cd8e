"""Services and ports, suspend and resume, standbys: on real agents and real processes.

A machine with services gets a host port of its own for each internal port (``PORT``), kept
with its record across an agent restart and freed when it is destroyed; two machines of one
app on one worker both serve. A suspended machine keeps its process, memory and port, answers
nothing while frozen, and serves again on resume."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import httpx
import pytest

from souq.errors import IllegalTransition, InsufficientCapacity, InvalidInput
from souq.model import MachineState
from souq.testing import Cluster, auth_headers, wait_until
from tests.clusters import ClusterSpec
from tests.integration.services_harness import ECHO, app_name


def served(port: int, path: str = "/") -> dict[str, object] | None:
    try:
        r = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=0.5)
    except httpx.HTTPError:
        return None
    return dict(r.json()) if r.status_code == 200 else None


def config(**extra: object) -> dict[str, object]:
    return {
        "cmd": [sys.executable, ECHO],
        "guest": {"cpus": 0.1, "memory_mb": 64},
        "services": [{"internal_port": 8080, "autostop": "suspend"}],
        "checks": {"alive": {"type": "http", "port": 8080, "path": "/", "interval": "1s"}},
        **extra,
    }


CLUSTER = ClusterSpec("services", regions={"mad": 1})


def test_each_machine_gets_its_own_port_and_serves_on_it(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name("s")
    a = client.create_machine(app, "mad", config())
    b = client.create_machine(app, "mad", config())
    assert a.worker_id == b.worker_id  # one worker: both on the same host
    assert a.address is not None and b.address is not None
    pa, pb = a.address.ports[8080], b.address.ports[8080]
    assert pa != pb
    assert a.address.host == "127.0.0.1"
    got = wait_until(lambda: served(pa), message="machine a to serve on its port")
    assert got["machine_id"] == a.id and got["port"] == str(pa)
    assert wait_until(lambda: served(pb), message="machine b to serve")["machine_id"] == b.id
    # The cluster view carries the address too.
    listed = {m.id: m for m in client.list_machines(app)}
    assert listed[a.id].address == a.address
    # Destroyed: its port goes back to the pool (a new machine may get it later).
    client.destroy(app, a.id, force=True)
    wait_until(lambda: served(pa) is None, message="machine a's port to close")
    client.destroy(app, b.id, force=True)


def test_suspend_freezes_the_process_and_start_resumes_it(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name("s")
    m = client.create_machine(app, "mad", config())
    port = m.address.ports[8080] if m.address else 0
    wait_until(lambda: served(port), message="the machine to serve")
    s = client.suspend(app, m.id)
    assert s.state == MachineState.SUSPENDED
    assert s.pid == m.pid  # the same process, frozen
    # Frozen: the port still accepts connections (the kernel queues them) but nothing answers.
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(100)
    with pytest.raises(IllegalTransition):
        client.signal(app, m.id, "SIGUSR1")  # only a running machine takes a signal
    r = client.start(app, m.id)
    assert r.state == MachineState.STARTED and r.pid == m.pid
    assert [e.type for e in r.events[:2]] == ["resume", "suspend"]
    assert served(port) is not None  # answers again at once
    # A suspended machine can be stopped: thawed, then signalled.
    client.suspend(app, m.id)
    stopped = client.stop(app, m.id)
    assert stopped.state in (MachineState.STOPPING, MachineState.STOPPED)
    client.wait(app, m.id, "stopped", timeout=10)
    client.destroy(app, m.id)


def test_a_standby_is_made_stopped_on_another_worker_than_its_primary(cluster: Cluster) -> None:
    second = cluster.add_agent("mad")  # for this test: the others see one worker
    try:
        cluster.wait_for_workers()
        client = cluster.client()
        app = app_name("s")
        primary = client.create_machine(app, "mad", config())
        standby = client.create_machine(app, "mad", config(standbys=[primary.id]))
        assert standby.worker_id != primary.worker_id
        assert standby.state == MachineState.STOPPED
        assert standby.events[0].type == "standby"
        assert standby.address is not None and 8080 in standby.address.ports
        started = client.start(app, standby.id)
        assert started.state in (MachineState.STARTING, MachineState.STARTED)
        port = standby.address.ports[8080]
        got = wait_until(lambda: served(port), message="the standby to serve")
        assert got["machine_id"] == standby.id
        for machine in (standby, primary):
            client.destroy(app, machine.id, force=True)
    finally:
        second.stop()
        cluster.agents.remove(second)


def test_a_standby_needs_a_known_primary_and_another_worker(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name("s")
    with pytest.raises(InvalidInput) as err:
        client.create_machine(app, "mad", config(standbys=["m0000000000000"]))
    assert "standbys: machine m0000000000000 is not known" in err.value.message
    primary = client.create_machine(app, "mad", config())
    with pytest.raises(InsufficientCapacity) as full:
        client.create_machine(app, "mad", config(standbys=[primary.id]))
    assert "standby_primary" in str(full.value.details)
    client.destroy(app, primary.id, force=True)


def test_bad_services_are_refused_with_the_field_named(cluster: Cluster) -> None:
    r = httpx.post(
        f"{cluster.api_url}/v1/apps/{app_name('s')}/machines",
        json={
            "region": "mad",
            "config": config(
                services=[
                    {"internal_port": 8080, "concurrency": {"soft_limit": 9, "hard_limit": 3}}
                ]
            ),
        },
        headers=auth_headers(),
    )
    assert r.status_code == 422
    assert r.json()["status"] == "invalid_input"
    assert "soft_limit (9) must not exceed hard_limit (3)" in r.json()["error"]
    r = httpx.post(
        f"{cluster.api_url}/v1/apps/{app_name('s')}/machines",
        json={"region": "mad", "config": config(checks={"c": {"type": "http", "port": 0}})},
        headers=auth_headers(),
    )
    assert r.status_code == 422 and "checks.c.port" in r.json()["error"]


def test_ports_survive_an_agent_restart(tmp_path: Path) -> None:
    with Cluster(tmp_path, regions={"mad": 1}) as c:
        client = c.client()
        app = app_name("s")
        m = client.create_machine(app, "mad", config())
        assert m.address is not None
        port = m.address.ports[8080]
        agent = c.agents[0]
        agent.stop_machines_on_exit = False
        agent.kill()  # kill -9: the machine keeps running, the next agent re-adopts it
        agent.start()
        c.wait_for_workers()
        again = client.get_machine(app, m.id)
        assert again.address == m.address and again.pid == m.pid
        # A new machine does not get the port the first one still holds.
        other = client.create_machine(app, "mad", config())
        assert other.address is not None and other.address.ports[8080] != port
        client.destroy(app, m.id, force=True)
        client.destroy(app, other.id, force=True)


def test_a_stop_leaves_rotation_before_its_signal(cluster: Cluster) -> None:
    client = cluster.client()
    app = app_name("s")
    m = client.create_machine(app, "mad", config(stop_config={"drain_s": 30, "timeout_s": 5}))
    port = m.address.ports[8080] if m.address else 0
    wait_until(lambda: served(port), message="the machine to serve")
    stopping = client.stop(app, m.id)
    # `stopping` at once (a proxy stops routing to it), and the process still serves what
    # reaches it: the signal waits out the drain.
    assert stopping.state == MachineState.STOPPING
    assert stopping.events[0].message == "out of rotation 30s before the signal"
    assert served(port) is not None
    ops = client.ops(app, m.id)
    assert ops[-1].state == "draining"
    # A forced destroy does not wait for the drain.
    client.destroy(app, m.id, force=True)
    wait_until(lambda: served(port) is None, message="the process to be gone")
