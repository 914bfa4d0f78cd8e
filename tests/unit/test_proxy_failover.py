"""Failover on the in-memory bus: a worker reported down twice while its standby's start is on
the way starts the standby once, and the decision is recorded once."""

from __future__ import annotations

import asyncio

from souq.bus import subjects
from souq.bus.codec import ok_reply
from souq.bus.memory import MemoryTransport
from souq.clock import iso_from_ms
from souq.model import Machine, MachineConfig, MachineEvent, MachineState, WorkerState
from souq.model.services import MachineAddress
from souq.protocol import WorkerClient
from souq.proxy import RoutingTable
from souq.proxy.decisions import Decisions
from souq.proxy.machines import MachineFeed
from souq.proxy.standby import Failover, in_its_place
from souq.testing import eventually

SERVICE = {"internal_port": 8080}


def machine(mid: str, worker: str, state: MachineState, standbys: tuple[str, ...] = ()) -> Machine:
    return Machine(
        id=mid,
        name=mid,
        app="web",
        region="mad",
        worker_id=worker,
        state=state,
        config=MachineConfig.model_validate(
            {"cmd": ["app"], "services": [SERVICE], "standbys": list(standbys)}
        ),
        created_at=iso_from_ms(0),
        updated_at=iso_from_ms(0),
        address=MachineAddress(host="127.0.0.1", ports={8080: 20000}),
    )


def test_a_worker_down_twice_starts_its_standby_once() -> None:
    async def main() -> tuple[int, list[str]]:
        bus = MemoryTransport()
        starts = 0
        answer = asyncio.Event()
        standby = machine("s1", "w2", MachineState.STOPPED, standbys=["p1"])

        async def on_start(subject: str, data: bytes) -> bytes:
            nonlocal starts
            starts += 1
            await answer.wait()
            return ok_reply(standby.model_copy(update={"state": MachineState.STARTED}))

        await bus.subscribe(subjects.worker("w2", "start"), on_start)
        feed = MachineFeed(RoutingTable(), lambda _: None)
        feed.seen(machine("p1", "w1", MachineState.STARTED))
        feed.seen(standby)
        decisions = Decisions()
        failover = Failover(feed, WorkerClient(bus), decisions, timeout_s=5)

        failover.worker_changed("w1", WorkerState.DOWN, WorkerState.UP)
        # A late heartbeat brings the worker back for a moment, then it is down again, all
        # before the first start is answered.
        failover.worker_changed("w1", WorkerState.UP, WorkerState.DOWN)
        failover.worker_changed("w1", WorkerState.DOWN, WorkerState.UP)
        for _ in range(10):
            await asyncio.sleep(0)
        answer.set()

        def failovers() -> list[str]:
            return [d["reason"] for d in decisions.recent("web") if d["kind"] == "failover"]

        # The start answered before the close (a close cancels the starts still on the way).
        await eventually(failovers, message="the failover's decision")
        await failover.aclose()
        return starts, failovers()

    starts, reasons = asyncio.run(main())
    assert starts == 1
    assert len(reasons) == 1
    assert "machine p1 is down: started its standby" in reasons[0]


def test_a_preempted_primary_starts_its_standby_once() -> None:
    async def main() -> tuple[int, list[str]]:
        bus = MemoryTransport()
        starts = 0
        standby = machine("s1", "w2", MachineState.STOPPED, standbys=["p1"])

        async def on_start(subject: str, data: bytes) -> bytes:
            nonlocal starts
            starts += 1
            return ok_reply(standby.model_copy(update={"state": MachineState.STARTED}))

        await bus.subscribe(subjects.worker("w2", "start"), on_start)
        feed = MachineFeed(RoutingTable(), lambda _: None)
        primary = machine("p1", "w1", MachineState.STARTED)
        feed.seen(primary)
        feed.seen(standby)
        decisions = Decisions()
        failover = Failover(feed, WorkerClient(bus), decisions, timeout_s=5)
        failover.machine_changed(primary)  # running: nothing to do
        started = MachineEvent(
            type="start", status=MachineState.STARTED, source="user", timestamp=1
        )
        preempted = MachineEvent(
            type="preempted",
            status=MachineState.STOPPING,
            source="agent",
            timestamp=2,
            message="preempted by machine m9 of app prod",
        )
        stopping = primary.model_copy(
            update={"state": MachineState.STOPPING, "events": [preempted, started]}
        )
        failover.machine_changed(stopping)
        failover.machine_changed(stopping.model_copy(update={"state": MachineState.STOPPED}))
        for _ in range(10):
            await asyncio.sleep(0)
        await failover.aclose()
        reasons = [d["reason"] for d in decisions.recent("web") if d["kind"] == "failover"]
        return starts, reasons

    starts, reasons = asyncio.run(main())
    assert starts == 1
    assert reasons == ["machine p1 was preempted: started its standby"]


def test_in_its_place_is_a_machine_at_rest_of_the_same_group_release_and_region() -> None:
    def of(
        mid: str, state: MachineState, group: str = "app", release: str = "3", **more: object
    ) -> Machine:
        m = machine(mid, "w2", state)
        meta = {"souq_process_group": group, "souq_release": release}
        config = m.config.model_copy(update={"metadata": meta})
        return m.model_copy(update={"config": config, **more})

    preempted = MachineEvent(
        type="preempted", status=MachineState.STOPPED, source="agent", timestamp=2
    )
    displaced = of("p1", MachineState.STOPPING)
    others = [
        of("a1", MachineState.STARTED),  # running already
        of("a2", MachineState.STOPPED, group="worker"),
        of("a3", MachineState.STOPPED, release="2"),
        of("a4", MachineState.STOPPED, region="syd"),
        of("a5", MachineState.STOPPED, events=[preempted]),  # displaced itself: no room
        of("a6", MachineState.STOPPED, cordoned=True),
        of("b2", MachineState.STOPPED),
        of("b1", MachineState.STOPPED),
    ]
    assert in_its_place(displaced, others) == others[-1]  # the smallest id
    assert in_its_place(displaced, others, starting={"b1"}) == others[-2]
    resting = of("c9", MachineState.SUSPENDED)
    assert in_its_place(displaced, [*others, resting]) == resting  # a resume is faster
    assert in_its_place(displaced, others[:6]) is None
