"""Failover to standbys, and machines on a lost worker out of rotation.

When a worker goes down (its heartbeats stop: the view's liveness says ``down``), its machines
leave rotation at once (requests would only time out on them), and every standby of a machine
on it (``standbys: [ID]`` on the standby, which was placed on another worker and waits
stopped) is started through its own worker. When the worker comes back, its machines return to
rotation (their health checks still have the last word). Each failover is recorded.

A primary displaced by a create of a higher priority class (an event ``preempted`` newer than
its last start: docs/placement.md) has its standbys started too, once per preemption: it is
stopping for good, on a worker that is up.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from souq.errors import SouqError
from souq.model import Machine, WorkerState
from souq.model.machine import preempted_event
from souq.model.protocol import StartCommand
from souq.protocol import WorkerClient
from souq.protocol.verbs import START
from souq.proxy.decisions import Decisions
from souq.proxy.machines import MachineFeed

__all__ = ["Failover"]

log = logging.getLogger(__name__)

_STARTABLE = {"stopped", "created", "suspended", "failed"}


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
        self._start_standbys(machine, machine.worker_id, f"machine {machine.id} was preempted")

    def _lost(self, worker_id: str) -> None:
        primaries = self.feed.on_worker(worker_id)
        for machine in primaries:
            self.feed.table.set_healthy(machine.id, False)
        for primary in primaries:
            self._start_standbys(
                primary, worker_id, f"worker {worker_id} of machine {primary.id} is down"
            )

    def _start_standbys(self, primary: Machine, not_on: str, why: str) -> None:
        loop = asyncio.get_running_loop()
        for standby_id in sorted(self.feed.standbys.get(primary.id, ())):
            standby = self.feed.machines.get(standby_id)
            if standby is None or standby.worker_id == not_on:
                continue
            if standby.state.value not in _STARTABLE or standby_id in self._starting:
                continue
            self._starting.add(standby_id)
            task = loop.create_task(
                self._start(standby.app, standby_id, standby.worker_id, primary.id, why)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _start(
        self, app: str, standby_id: str, on_worker: str, primary_id: str, why: str
    ) -> None:
        try:
            machine = await self.workers.call(
                on_worker,
                START,
                StartCommand(app=app, machine_id=standby_id, wake=True),
                timeout=self.timeout_s,
            )
        except SouqError as exc:
            self.decisions.record(
                "failover", app, standby_id, f"could not start the standby for {primary_id}: {exc}"
            )
            return
        finally:
            self._starting.discard(standby_id)
        self.feed.seen(machine)
        self.decisions.record(
            "failover",
            app,
            standby_id,
            f"{why}: started its standby",
        )

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
