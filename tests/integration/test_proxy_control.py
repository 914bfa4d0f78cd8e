"""The proxy's control plane on a real cluster: its table follows the cluster view's events, a
request's wake-up starts a stopped machine (or resumes a suspended one) and holds on until its
port accepts, the autostop round drains then stops an idle machine, a failing health check
takes a machine out of rotation, and a standby starts when its primary's worker is lost."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from souq.bus.nats import connect
from souq.errors import Conflict
from souq.model import MachineState
from souq.model.protocol import StartCommand
from souq.protocol.verbs import START
from souq.proxy.daemon import ControlPlane, ProxyConfig
from souq.testing import Cluster, eventually
from tests.clusters import ClusterSpec
from tests.integration.services_harness import app_name
from tests.integration.services_harness import echo_config as config

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


CLUSTER = ClusterSpec("proxy", regions={"mad": 2})


@contextlib.asynccontextmanager
async def control_plane(cluster: Cluster) -> AsyncIterator[ControlPlane]:
    """A proxy's control plane (no edge listener) on the cluster's bus, as the proxy's user."""
    transport = await connect(
        cluster.nats.url, name="test-proxy", credential=cluster.nats_credential("proxy")
    )
    plane = ControlPlane(
        ProxyConfig(nats_url=cluster.nats.url, region="mad", autostop_interval_s=3600),
        transport,
    )
    await plane.start()
    try:
        yield plane
    finally:
        await plane.aclose()
        await transport.close()


@pytest.fixture
async def control(cluster: Cluster) -> AsyncIterator[ControlPlane]:
    async with control_plane(cluster) as plane:
        yield plane


# Conditions on a real cluster under the box's load: more room than the default.
until = functools.partial(eventually, timeout=15.0)


def serves(port: int) -> dict[str, object] | None:
    try:
        return dict(httpx.get(f"http://127.0.0.1:{port}/", timeout=0.5).json())
    except httpx.HTTPError:
        return None


async def get(port: int) -> dict[str, object]:
    async with httpx.AsyncClient() as http:
        r = await http.get(f"http://127.0.0.1:{port}/", timeout=2)
    return dict(r.json())


async def test_the_table_follows_machine_events(cluster: Cluster, control: ControlPlane) -> None:
    client = cluster.client()
    app = app_name("p")
    m = await asyncio.to_thread(client.create_machine, app, "mad", config())
    backend = await until(lambda: control.table.get(m.id), message="the machine in the table")
    assert backend.state == "started" and backend.port == m.address.ports[8080]
    await asyncio.to_thread(client.stop, app, m.id)
    await until(
        lambda: (b := control.table.get(m.id)) is not None and b.state == "stopped",
        message="the table to see it stopped",
    )
    await asyncio.to_thread(client.destroy, app, m.id)
    await until(lambda: control.table.get(m.id) is None, message="the machine to leave the table")


async def test_a_wake_up_starts_a_stopped_machine_and_waits_for_its_port(
    cluster: Cluster, control: ControlPlane
) -> None:
    client = cluster.client()
    app = app_name("p")
    m = await asyncio.to_thread(client.create_machine, app, "mad", config())
    await asyncio.to_thread(client.stop, app, m.id)
    await asyncio.to_thread(client.wait, app, m.id, "stopped")
    await until(lambda: (b := control.table.get(m.id)) and b.state == "stopped", message="stopped")
    # Three requests need a machine at once: one wake-up serves them all.
    woken = await asyncio.gather(*(control.hooks.wake(app, "mad") for _ in range(3)))
    assert {b.machine_id for b in woken if b is not None} == {m.id}
    assert (await get(m.address.ports[8080]))["machine_id"] == m.id  # its port accepts
    wakes = [d for d in control.decisions.recent(app) if d["kind"] == "wake"]
    assert len(wakes) == 1 and "started the stopped machine" in wakes[0]["reason"]
    await asyncio.to_thread(client.destroy, app, m.id, force=True)


async def test_a_wake_up_resumes_a_suspended_machine(
    cluster: Cluster, control: ControlPlane
) -> None:
    client = cluster.client()
    app = app_name("p")
    m = await asyncio.to_thread(client.create_machine, app, "mad", config(autostop="suspend"))
    await until(lambda: control.table.get(m.id), message="the machine in the table")
    await asyncio.to_thread(client.suspend, app, m.id)
    await until(lambda: (b := control.table.get(m.id)) and b.state == "suspended", message="frozen")
    woken = await control.hooks.wake(app, "mad")
    assert woken is not None and woken.machine_id == m.id and woken.state == "started"
    assert (await get(m.address.ports[8080]))["machine_id"] == m.id
    [wake] = [d for d in control.decisions.recent(app) if d["kind"] == "wake"]
    assert "resumed the suspended machine" in wake["reason"]
    await asyncio.to_thread(client.destroy, app, m.id, force=True)


async def test_nothing_to_wake_is_none(cluster: Cluster, control: ControlPlane) -> None:
    client = cluster.client()
    app = app_name("p")
    m = await asyncio.to_thread(client.create_machine, app, "mad", config(autostart=False))
    await asyncio.to_thread(client.stop, app, m.id)
    await until(lambda: (b := control.table.get(m.id)) and b.state == "stopped", message="stopped")
    assert await control.hooks.wake(app, "mad") is None  # autostart is off
    await asyncio.to_thread(client.destroy, app, m.id, force=True)


async def test_autostop_drains_then_stops_the_machine_the_load_does_not_need(
    cluster: Cluster, control: ControlPlane
) -> None:
    client = cluster.client()
    app = app_name("p")
    a = await asyncio.to_thread(client.create_machine, app, "mad", config())
    b = await asyncio.to_thread(client.create_machine, app, "mad", config())
    await until(lambda: control.table.get(a.id) and control.table.get(b.id), message="both")
    busy = control.table.claim_machine(a.id)  # one request in flight on a
    assert busy is not None
    stopped = await control.autostop.round()
    assert [i.machine_id for i in stopped] == [b.id]  # the idle one
    assert "2 machines running, 0 over their soft limit" in stopped[0].reason
    got = await asyncio.to_thread(client.wait, app, b.id, "stopped")
    assert got.state == MachineState.STOPPED
    # The lone busy machine stays; once idle it is stopped in the next round.
    assert await control.autostop.round() == []
    control.table.release(busy)
    [last] = await control.autostop.round()
    assert last.machine_id == a.id and "no load" in last.reason
    for mid in (a.id, b.id):
        await asyncio.to_thread(client.destroy, app, mid, force=True)


async def test_a_failing_check_takes_the_machine_out_of_rotation(
    cluster: Cluster, control: ControlPlane
) -> None:
    client = cluster.client()
    app = app_name("p")
    cfg = config()
    cfg["checks"] = {"ready": {"type": "http", "port": 8080, "path": "/", "interval": "0.2s"}}
    m = await asyncio.to_thread(client.create_machine, app, "mad", cfg)
    await until(lambda: (b := control.table.get(m.id)) and b.healthy, message="healthy")
    # Stopped in its tracks (not suspended: the proxy would not route to that anyway), the
    # machine still counts as started, and its check times out.
    await asyncio.to_thread(client.signal, app, m.id, "SIGSTOP")
    await until(lambda: (b := control.table.get(m.id)) and not b.healthy, message="unhealthy")
    # (Its first check may have failed too, while the app was still starting.)
    bad = [d for d in control.decisions.recent(app) if d["kind"] == "unhealthy"][-1]
    assert not control.table.pick(app, region="mad")  # nothing to route to
    assert "check ready failed" in bad["reason"]
    await asyncio.to_thread(client.signal, app, m.id, "SIGCONT")
    await until(lambda: (b := control.table.get(m.id)) and b.healthy, message="healthy again")
    await asyncio.to_thread(client.destroy, app, m.id, force=True)


async def test_a_standby_starts_when_its_primarys_worker_is_lost(tmp_path: Path) -> None:
    with Cluster(tmp_path, regions={}) as c:
        for _ in range(2):
            c.add_agent("mad", heartbeat_interval_s=0.2, stop_machines_on_exit=False)
        c.wait_for_workers()
        orphans: list[int] = []  # the lost worker's machine runs on, as a crash leaves it
        try:
            async with control_plane(c) as plane:
                client = c.client()
                app = app_name("p")
                primary = await asyncio.to_thread(client.create_machine, app, "mad", config())
                standby = await asyncio.to_thread(
                    client.create_machine, app, "mad", {**config(), "standbys": [primary.id]}
                )
                assert standby.state == MachineState.STOPPED
                await until(lambda: plane.table.get(standby.id), message="the standby in the table")
                [lost] = [a for a in c.agents if a.worker_id == primary.worker_id]
                t0 = time.monotonic()
                orphans = lost.machine_pids()
                lost.kill()  # kill -9: the worker's heartbeats stop
                await until(
                    lambda: (b := plane.table.get(standby.id)) and b.state == "started",
                    message="the standby to be started",
                )
                took = time.monotonic() - t0
                port = standby.address.ports[8080]
                served = await until(lambda: serves(port), message="the standby to serve")
                assert served["machine_id"] == standby.id
                assert plane.table.get(primary.id).healthy is False  # out of rotation
                [failover] = [d for d in plane.decisions.recent(app) if d["kind"] == "failover"]
                assert f"machine {primary.id} is down: started its standby" in failover["reason"]
                assert took < 10
        finally:
            # Nothing of the test outlives it: the lost worker's machine, and the standby the
            # other worker runs (neither agent stops its machines when it exits; the living one
            # is stopped first, so that its restart policy does not start the standby again).
            for agent in c.agents:
                agent.stop()
                orphans += agent.machine_pids()
            for pid in orphans:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


async def test_a_standby_starts_when_its_primary_is_preempted(tmp_path: Path) -> None:
    # Two workers of 1 cpu: the spot primary fills one, its (standard) standby the other.
    with Cluster(tmp_path, regions={"mad": 2}, cpus=1) as c:
        async with control_plane(c) as plane:
            client = c.client()
            app = app_name("p")
            size = {"cpus": 1, "memory_mb": 64}
            primary = await asyncio.to_thread(
                client.create_machine,
                app,
                "mad",
                {**config(), "guest": size, "priority_class": "spot"},
            )
            standby = await asyncio.to_thread(
                client.create_machine,
                app,
                "mad",
                {**config(), "guest": size, "standbys": [primary.id]},
            )
            assert standby.state == MachineState.STOPPED
            await until(lambda: plane.table.get(standby.id), message="the standby in the table")
            # A standard machine of another app fits nowhere: it displaces the spot primary.
            taker = await asyncio.to_thread(
                client.create_machine,
                app_name("q"),
                "mad",
                {"cmd": ["sleep", "600"], "guest": size},
            )
            assert taker.placement is not None
            assert [v.machine_id for v in taker.placement.preempted] == [primary.id]
            await until(
                lambda: (b := plane.table.get(standby.id)) and b.state == "started",
                message="the standby to be started",
            )
            served = await until(lambda: serves(standby.address.ports[8080]), message="serving")
            assert served["machine_id"] == standby.id
            [failover] = [d for d in plane.decisions.recent(app) if d["kind"] == "failover"]
            assert f"machine {primary.id} was preempted: started its standby" in failover["reason"]
            assert (await asyncio.to_thread(client.get_machine, app, primary.id)).state in (
                MachineState.STOPPING,
                MachineState.STOPPED,
            )


async def test_a_preempted_machine_is_not_woken_for_a_request(tmp_path: Path) -> None:
    """Displaced, a machine holds no room: its start takes some again, which its app's quota
    counts first, and only the API's start asks the quota. The proxy leaves it stopped (and its
    worker refuses a wake-up that tries), until the API starts it."""
    with Cluster(tmp_path, regions={"mad": 1}, cpus=1) as c:
        async with control_plane(c) as plane:
            client = c.client()
            app, other = app_name("p"), app_name("q")
            size = {"cpus": 1, "memory_mb": 64}
            spot = await asyncio.to_thread(
                client.create_machine,
                app,
                "mad",
                {**config(), "guest": size, "priority_class": "spot"},
            )
            taker = await asyncio.to_thread(
                client.create_machine, other, "mad", {"cmd": ["sleep", "600"], "guest": size}
            )
            assert taker.placement is not None
            assert [v.machine_id for v in taker.placement.preempted] == [spot.id]
            await asyncio.to_thread(client.wait, app, spot.id, "stopped", timeout=30)
            backend = await until(
                lambda: (b := plane.table.get(spot.id)) and b.state == "stopped" and b,
                message="the victim stopped in the table",
            )
            assert not backend.autostart
            assert await plane.waker.wake(app, "mad") is None  # nothing to wake
            with pytest.raises(Conflict) as refused:  # the worker says no to a wake-up too
                await plane.waker.workers.call(
                    spot.worker_id,
                    START,
                    StartCommand(app=app, machine_id=spot.id, wake=True),
                    timeout=10,
                )
            assert "displaced by preemption" in refused.value.message
            assert (await asyncio.to_thread(client.get_machine, app, spot.id)).state == "stopped"
            # Its room back, the API's start takes it (and would ask the quota first).
            await asyncio.to_thread(client.destroy, other, taker.id, force=True)
            started = await asyncio.to_thread(client.start, app, spot.id)
            assert started.state in (MachineState.STARTING, MachineState.STARTED)
            await until(
                lambda: (b := plane.table.get(spot.id)) and b.autostart,
                message="woken by the proxy again once it started",
            )
