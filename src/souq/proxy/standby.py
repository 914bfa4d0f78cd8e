"""Failover to standbys, and machines on a lost worker out of rotation.

When a worker goes down (its heartbeats stop: the view's liveness says ``down``), its machines
leave rotation at once (requests would only time out on them), and every standby of a machine
on it (``standbys: [ID]`` on the standby, which was placed on another worker and waits
stopped) is started through its own worker. When the worker comes back, its machines return to
rotation (their health checks still have the last word). Each failover is recorded.

A primary displaced by a create of a higher priority class (an event ``preempted`` newer than
its last start: docs/placement.md) has its standbys started too, once per preemption: it is
stopping for good, on a worker that is up. A deploy's served machine has no standby: when one
that was running is displaced, a machine of its app's process group and release in its region
that is at rest (stopped or suspended by autostop or a user, holding its room) is started in its
place (:func:`in_its_place`; suspended first, then by id, so that every proxy picks the same
one), and the decision says which; with none at rest, the decision says so, and a new machine
is a client's to make (a deploy, ``souq scale reconcile [--watch]``: souq.apps.plan). The proxy
makes no machine: its bus permissions are to start, stop and suspend.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from souq.errors import SouqError
from souq.model import Machine, MachineState, WorkerState
from souq.model.machine import preempted_event
from souq.model.protocol import StartCommand
from souq.protocol import WorkerClient
from souq.protocol.verbs import START
from souq.proxy.decisions import Decisions
from souq.proxy.machines import MachineFeed

__all__ = ["Failover", "in_its_place"]

log = logging.getLogger(__name__)

_STARTABLE = {"stopped", "created", "suspended", "failed"}
_AT_REST = (MachineState.STOPPED, MachineState.SUSPENDED)
# What a deploy writes in its machines' metadata (souq.apps.config): their group and release.
GROUP, RELEASE = "souq_process_group", "souq_release"


@dataclass
class Failover:
    feed: MachineFeed
    workers: WorkerClient
    decisions: Decisions
    timeout_s: float
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    # Standbys being started: a worker reported down again (down, up, down) before the first
    # start is answered must not start them twice.
    _starting: set[str] = field(default_factory=set)
    # Primaries whose preemption started their standbys: machine id -> its `preempted` event's
    # time (a record seen again must not start them again).
    _preempted: dict[str, int] = field(default_factory=dict)

    def worker_changed(
        self, worker_id: str, state: WorkerState, before: WorkerState | None
    ) -> None:
        """The view's ``on_worker``: a worker's state changed."""
        if state == WorkerState.DOWN:
            self._lost(worker_id)
        elif before == WorkerState.DOWN:
            for machine in self.feed.on_worker(worker_id):
                self.feed.table.set_healthy(machine.id, True)

    def machine_changed(self, machine: Machine) -> None:
        """A machine's record changed: a primary that was preempted starts its standbys."""
        event = preempted_event(machine)
        if event is None:
            self._preempted.pop(machine.id, None)
            return
        if self._preempted.get(machine.id) == event.timestamp:
            return
        self._preempted[machine.id] = event.timestamp
        why = f"machine {machine.id} was preempted"
        if self._start_standbys(machine, machine.worker_id, why):
            return
        if event.status is MachineState.STOPPED or GROUP not in machine.config.metadata:
            return  # it served nothing (displaced at rest), or it is no deploy's
        sibling = in_its_place(machine, self.feed.machines.values(), self._starting)
        if sibling is None:
            self.decisions.record(
                "failover",
                machine.app,
                machine.id,
                f"{why}: no machine of its group at rest to start in its place (a deploy or "
                "`souq scale reconcile` re-places it)",
            )
            return
        done = f"{why}: started machine {sibling.id} of its group in its place"
        self._launch(sibling, machine.id, done=done)

    def _lost(self, worker_id: str) -> None:
        primaries = self.feed.on_worker(worker_id)
        for machine in primaries:
            self.feed.table.set_healthy(machine.id, False)
        for primary in primaries:
            self._start_standbys(
                primary, worker_id, f"worker {worker_id} of machine {primary.id} is down"
            )

    def _start_standbys(self, primary: Machine, not_on: str, why: str) -> int:
        """Start the standbys of ``primary`` not on worker ``not_on``; how many it starts."""
        started = 0
        for standby_id in sorted(self.feed.standbys.get(primary.id, ())):
            standby = self.feed.machines.get(standby_id)
            if standby is None or standby.worker_id == not_on:
                continue
            if standby.state.value not in _STARTABLE or standby_id in self._starting:
                continue
            self._launch(standby, primary.id, done=f"{why}: started its standby")
            started += 1
        return started

    def _launch(self, machine: Machine, for_id: str, *, done: str) -> None:
        self._starting.add(machine.id)
        task = asyncio.get_running_loop().create_task(self._start(machine, for_id, done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start(self, standby: Machine, for_id: str, done: str) -> None:
        app = standby.app
        try:
            machine = await self.workers.call(
                standby.worker_id,
                START,
                StartCommand(app=app, machine_id=standby.id, wake=True),
                timeout=self.timeout_s,
            )
        except SouqError as exc:
            self.decisions.record(
                "failover", app, standby.id, f"could not start it in place of {for_id}: {exc}"
            )
            return
        finally:
            self._starting.discard(standby.id)
        self.feed.seen(machine)
        self.decisions.record("failover", app, standby.id, done)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def in_its_place(
    displaced: Machine, machines: Iterable[Machine], starting: Collection[str] = ()
) -> Machine | None:
    """The machine at rest a proxy starts in the place of ``displaced`` (a deploy's served
    machine that preemption displaced): of its app, process group, release and region, stopped
    or suspended (holding its room: not displaced itself), no standby, not cordoned, not being
    started; suspended first (a resume is faster), then the smallest id. None: there is none."""
    meta = displaced.config.metadata
    found = [
        m
        for m in machines
        if m.app == displaced.app
        and m.id != displaced.id
        and m.region == displaced.region
        and m.config.metadata.get(GROUP) == meta.get(GROUP)
        and m.config.metadata.get(RELEASE) == meta.get(RELEASE)
        and m.state in _AT_REST
        and not m.config.standbys
        and not m.cordoned
        and m.id not in starting
        and preempted_event(m) is None
    ]
    return min(found, key=lambda m: (m.state is not MachineState.SUSPENDED, m.id), default=None)
