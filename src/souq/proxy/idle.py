"""The autostop round: every ``--autostop-interval`` the proxy stops (or suspends) machines the
load does not need, by the rule of :mod:`souq.proxy.autostop`.

A machine is idle when nothing is in flight on it and it served no request for a whole interval
(a machine just woken for a request counts as having served), and only once it has proven
itself: a started machine whose health checks have not all passed since its start is no
candidate (nor counted as running: it cannot serve yet), and one that passed them less than two
of its check intervals ago is not chosen (``settling``: its worker runs the same checks on the
same interval, and a deploy sees the machine healthy when the worker's pass). A deploy waits
for exactly that on the machines it makes or updates, so the proxy never stops one under it.
A machine whose stop was refused for its lease (a deploy holds it) is not chosen again until
the lease ends.

A machine chosen leaves rotation first (the table drains it: no new request goes to it), the
round waits for what it is serving to finish (at most ``drain_s``), and only then is its stop
(or suspend) sent to its worker: a stream of requests sees no error. Each stop is recorded
with the rule's reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from souq.errors import LeaseHeld, SouqError
from souq.model import Machine, MachineRef, StopCommand
from souq.protocol import WorkerClient
from souq.protocol.verbs import STOP, SUSPEND
from souq.proxy.autostop import Idle, Running, choose
from souq.proxy.decisions import Decisions
from souq.proxy.machines import MachineFeed, http_service

__all__ = ["Autostop"]

log = logging.getLogger(__name__)

_DRAIN_POLL_S = 0.01


@dataclass
class Autostop:
    feed: MachineFeed
    workers: WorkerClient
    decisions: Decisions
    drain_s: float = 30.0
    timeout_s: float = 10.0
    # Since when (time.monotonic()) a started machine's checks have all passed since its start;
    # None while they have not (souq.proxy.health.HealthChecks.ready_since).
    ready_since: Callable[[str], float | None] = lambda _: 0.0
    _active: dict[str, float] = field(default_factory=dict)  # machine id -> when it last served
    _held: set[str] = field(default_factory=set)  # machines a wake-up is starting
    _leased: dict[str, float] = field(default_factory=dict)  # machine id -> lease's end (monotonic)
    _interval: float = 0.0

    def touch(self, machine_id: str) -> None:
        """The machine served a request (or was just woken for one): not idle this round."""
        self._active[machine_id] = time.monotonic()
        self._held.discard(machine_id)

    def hold(self, machine_id: str) -> None:
        """A wake-up is starting the machine: never stopped until it has served (:meth:`touch`)."""
        self._held.add(machine_id)

    def _recently_active(self, machine_id: str) -> bool:
        at = self._active.get(machine_id)
        return at is not None and time.monotonic() - at < self._interval

    def running(self) -> list[Running]:
        """Every started, serving machine with its load now."""
        table = self.feed.table
        out = []
        for machine in self.feed.machines.values():
            service = http_service(machine)
            backend = table.get(machine.id)
            if service is None or backend is None or backend.state != "started":
                continue
            if table.is_draining(machine.id) or machine.id in self._held:
                continue
            ready = self.ready_since(machine.id)
            if ready is None:  # not proven since it started: it cannot serve yet
                continue
            # A machine that served within the last interval counts as loaded: idle means no
            # request for a whole interval, not a gap between two.
            load = table.load(machine.id) + self._recently_active(machine.id)
            out.append(
                Running(
                    machine.id,
                    machine.app,
                    machine.region,
                    load,
                    service.concurrency.soft_limit,
                    service.autostop,
                    service.min_machines_running,
                    settling=time.monotonic() - ready < _settle_s(machine),
                    leased=self._leased.get(machine.id, 0.0) > time.monotonic(),
                )
            )
        return out

    async def round(self) -> list[Idle]:
        """One round: choose, drain, then stop or suspend."""
        chosen = choose(self.running())
        await asyncio.gather(*(self._stop(idle) for idle in chosen))
        return chosen

    async def _stop(self, idle: Idle) -> None:
        table = self.feed.table
        machine = self.feed.machines.get(idle.machine_id)
        if machine is None:
            return
        table.draining(idle.machine_id)
        loop = asyncio.get_running_loop()
        until = loop.time() + self.drain_s
        # The load is a plain counter the relay updates on its hot path (no event to wait on).
        while table.load(idle.machine_id) > 0 and loop.time() < until:  # noqa: ASYNC110
            await asyncio.sleep(_DRAIN_POLL_S)
        ref = MachineRef(app=machine.app, machine_id=machine.id)
        try:
            if idle.action == "suspend":
                done = await self.workers.call(
                    machine.worker_id, SUSPEND, ref, timeout=self.timeout_s
                )
            else:
                done = await self.workers.call(
                    machine.worker_id,
                    STOP,
                    StopCommand(app=machine.app, machine_id=machine.id),
                    timeout=self.timeout_s,
                )
        except SouqError as exc:
            table.draining(idle.machine_id, False)
            if isinstance(exc, LeaseHeld):  # a deploy's: not chosen again until its lease ends
                self._leased[idle.machine_id] = time.monotonic() + _left_s(exc)
            log.info("autostop of machine %s failed: %s", idle.machine_id, exc)
            return
        self.feed.seen(done)
        verb = "suspended" if idle.action == "suspend" else "stopped"
        self.decisions.record("autostop", idle.app, idle.machine_id, f"{verb}: {idle.reason}")

    async def run(self, interval_s: float) -> None:
        self._interval = interval_s
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.round()
            except Exception:  # a round must not end the loop
                log.exception("an autostop round failed")


def _settle_s(machine: Machine) -> float:
    """How long a machine that just proved itself is not chosen: two of its longest check
    interval (the worker's checks, which a deploy waits on, pass within one of the proxy's)."""
    return 2 * max((c.interval for c in machine.config.checks.values()), default=0.0)


def _left_s(held: LeaseHeld) -> float:
    """Seconds until the lease ``held`` names ends (its ``expires_at``, ms since the epoch)."""
    end = held.details.get("expires_at")
    return max(0.0, end / 1000 - time.time()) if isinstance(end, int | float) else 0.0
