"""The cluster view on the bus: keeps a :class:`ViewStore` in step with the workers.

* Every machine event (``souq.evt.>``) is applied to its row at once, and appended to the
  broker's :class:`EventLog`. An event for a machine the view has not seen makes it fetch the
  record from the worker (``get``).
* Anti-entropy: every ``sync_interval_s`` (and at once when a worker appears or comes back) the
  view gathers ``souq.all.digest``; a worker whose digest differs from the view's rows for it is
  listed (``souq.worker.<id>.list``) and its rows are replaced — at once if it was not synced
  yet, else when it differs in two rounds running (a single difference is usually events still
  in flight). A missed or reordered event heals within two rounds.
* Worker liveness comes from :class:`souq.view.liveness.Liveness`; a watcher turns changes of a
  worker's state into worker events.
* Outages: after the broker's own reconnection every worker is compared again (:meth:`resync`);
  a worker that reconnected (:meth:`resync_worker`, from its heartbeat) is re-listed whatever
  its digest says, since a digest does not cover everything a record holds (restarts, pid).
  Events of a re-listed record that the event log never had are appended to it then
  (:class:`souq.view.seen.SeenEvents`): the stream misses nothing an outage swallowed, and
  tells nothing twice.

The view is *complete* once every worker that is not down has been synced since it was last seen
appearing or coming back; until then the broker answers lists the old way (asking every worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from souq.bus import Subscription, Transport, subjects
from souq.bus.codec import decoding
from souq.clock import Clock
from souq.daemon import cancel_tasks
from souq.errors import SouqError
from souq.model import (
    DigestCommand,
    ListCommand,
    Machine,
    MachineRef,
    WorkerDigest,
    WorkerState,
)
from souq.model.wire import MachineEventNote, decode_notes
from souq.protocol import WorkerClient
from souq.protocol.verbs import DIGEST, GET, LIST
from souq.view.digest import machines_digest
from souq.view.events import EventLog
from souq.view.held import LaunchHolds
from souq.view.seen import SeenEvents
from souq.view.store import ViewStore

__all__ = ["ClusterView", "ViewStatus", "WorkerSource"]

log = logging.getLogger(__name__)

TOMBSTONE_TTL_MS = 10 * 60 * 1000
SYNC_SLICE = 100  # workers asked for their digests at a time in a large cluster


class WorkerSource(Protocol):
    """What the view needs of the worker table (a :class:`Liveness` provides it)."""

    def states(self) -> list[tuple[str, str, WorkerState]]:
        """``(worker id, region, state now)`` of every worker known."""
        ...

    def changes(self) -> list[tuple[str, str, WorkerState]]:
        """The same, of the workers whose state may have changed since the last call."""
        ...

    def state_of(self, worker_id: str) -> WorkerState | None: ...


@dataclass(frozen=True)
class ViewStatus:
    complete: bool
    as_of_ms: int | None  # the last time every live worker was confirmed equal to the view
    lag_ms: int  # how late the last applied event arrived (receipt - its timestamp)
    machines: int  # rows, tombstones included
    bytes: int  # what the view's SQLite database holds


def _by_machine(msgs: list[MachineEventNote]) -> list[list[MachineEventNote]]:
    """Consecutive runs of one machine's events, in order."""
    runs: list[list[MachineEventNote]] = []
    for msg in msgs:
        if runs and runs[-1][0].machine_id == msg.machine_id:
            runs[-1].append(msg)
        else:
            runs.append([msg])
    return runs


class ClusterView:
    def __init__(
        self,
        transport: Transport,
        workers: WorkerSource,
        clock: Clock,
        *,
        sync_interval_s: float = 5.0,
        tick_s: float = 0.25,
        request_timeout_s: float = 2.0,
        events_capacity: int = 10_000,
        on_machine_event: Callable[[MachineEventNote], None] | None = None,
        on_change: Callable[[str], None] | None = None,
        on_worker: Callable[[str, WorkerState, WorkerState | None], None] | None = None,
    ) -> None:
        self.store = ViewStore()
        # Told of every machine event the view decodes (the broker's routing cache), so that
        # one subscription and one decode serve both.
        self._on_machine_event = on_machine_event
        # Told the id of every machine whose row changed, once the change is applied (the
        # proxy's routing table follows the view this way); and of every worker state change.
        self._on_change = on_change
        self._on_worker = on_worker
        self.events = EventLog(events_capacity)
        self._seen = SeenEvents(events_capacity, horizon_ms=clock.now_ms())
        self._transport = transport
        self._client = WorkerClient(transport)
        self._workers = workers
        self._clock = clock
        self._sync_interval_s = sync_interval_s
        self._tick_s = tick_s
        self._timeout = request_timeout_s
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._fetching: set[str] = set()
        self._fetches: set[asyncio.Task[None]] = set()
        self._synced: set[str] = set()
        self._suspects: set[str] = set()  # synced workers whose digest differed last round
        self._relist: set[str] = set()  # workers to re-list whatever their digest says
        self._states: dict[str, WorkerState] = {}
        self._wake = asyncio.Event()
        self._rounds = 0
        self._as_of_ms: int | None = None
        self._lag_ms = 0
        self.applied = 0  # events applied (a counter for metrics and tests)
        self._holds = LaunchHolds()

    async def start(self) -> None:
        on_event = decoding(
            decode_notes,
            self._on_message,
            ignoring="the view ignores an event",
            log=log,
        )
        self._sub = await self._transport.subscribe(subjects.ALL_EVENTS, on_event)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="souq-view")

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        await cancel_tasks([self._task, *self._fetches])
        self._task = None
        self.store.close()

    # -- status ------------------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        if self._rounds == 0:
            return False
        return all(
            wid in self._synced
            for wid, _, state in self._workers.states()
            if state != WorkerState.DOWN
        )

    def status(self) -> ViewStatus:
        return ViewStatus(
            complete=self.complete,
            as_of_ms=self._as_of_ms,
            lag_ms=self._lag_ms,
            machines=self.store.size(),
            bytes=self.store.memory_bytes(),
        )

    # -- changes -----------------------------------------------------------------------------

    def apply(self, machine: Machine) -> None:
        """A machine record straight from its worker (e.g. a create or destroy this broker
        made): read-your-writes on this broker."""
        self.store.apply_machine(machine)
        self._changed(machine.id)

    def _changed(self, machine_id: str) -> None:
        if self._on_change is not None:
            self._on_change(machine_id)

    def _on_message(self, msgs: list[MachineEventNote]) -> None:
        """One event message: one event, or a worker's batch of them."""
        if len(msgs) == 1:
            self.on_events(msgs)
            return
        with self.store.transaction():  # a worker's batch of events: one write
            for run in _by_machine(msgs):
                self.on_events(run)

    def on_events(self, msgs: list[MachineEventNote]) -> None:
        """Events of one machine, oldest first: told in the event log, applied to its row."""
        for msg in msgs:
            if self._on_machine_event is not None:
                self._on_machine_event(msg)
            if self._seen.first_time(msg.machine_id, msg.event):
                self.events.append_machine(
                    machine_id=msg.machine_id,
                    app=msg.app,
                    worker_id=msg.worker_id,
                    region=msg.region,
                    event=msg.event,
                )
        self._lag_ms = max(0, self._clock.now_ms() - msgs[-1].event.timestamp)
        if self._holds and self._holds.take(msgs):
            return  # its machine's create is this broker's: applied with the claim's answer
        self._store(msgs)

    def hold_launch(self, request_id: str) -> None:
        """This broker is placing ``request_id``: its machine's events wait for the claim's
        answer (:mod:`souq.view.held`); :meth:`release` must follow, whatever the claim ends
        as."""
        self._holds.hold(request_id)

    def release(self, request_id: str, machine: Machine | None = None) -> None:
        """The claim of ``request_id`` ended: its answer (``machine``, None if there is none)
        applied, then the events held for it."""
        if machine is not None:
            self.apply(machine)
        for run in self._holds.release(request_id):
            self._store(run)

    def _store(self, msgs: list[MachineEventNote]) -> None:
        applied = self.store.apply_events(msgs)
        if applied is None:
            self._fetch(msgs[-1])
        elif applied:
            self.applied += 1
            self._changed(msgs[-1].machine_id)

    def _fetch(self, msg: MachineEventNote) -> None:
        if msg.machine_id in self._fetching:
            return
        self._fetching.add(msg.machine_id)
        task = asyncio.get_running_loop().create_task(self._get(msg))
        self._fetches.add(task)
        task.add_done_callback(self._fetches.discard)

    async def _get(self, msg: MachineEventNote) -> None:
        ref = MachineRef(app=msg.app, machine_id=msg.machine_id)
        try:
            machine = await self._client.call(msg.worker_id, GET, ref, timeout=self._timeout)
            self.store.apply_machine(machine)
            self.applied += 1
            self._changed(machine.id)
        except (SouqError, ValueError) as exc:
            log.info("the view could not fetch machine %s: %s", msg.machine_id, exc)
        finally:
            self._fetching.discard(msg.machine_id)

    # -- the loop: worker states and anti-entropy --------------------------------------------

    async def _run(self) -> None:
        next_round = 0.0
        while True:
            self._watch_workers()
            now = self._clock.monotonic()
            if now >= next_round or self._wake.is_set():
                self._wake.clear()
                try:
                    if self._transport.connected:  # (the reconnection wakes the loop)
                        await self.sync_round()
                except SouqError as exc:
                    log.info("a view sync round failed: %s", exc)
                next_round = self._clock.monotonic() + self._sync_interval_s
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._tick_s):
                    await self._wake.wait()

    def _watch_workers(self) -> None:
        """Turn changes of each worker's state into worker events; a worker that appears or
        comes back must be synced again before the view counts as complete."""
        now = self._clock.now_ms()
        changed = [
            (region, wid, state)
            for wid, region, state in self._workers.changes()
            if self._states.get(wid) != state
        ]
        for region, wid, state in sorted(changed):
            before = self._states.get(wid)
            self._states[wid] = state
            if state != WorkerState.DOWN and (before is None or before == WorkerState.DOWN):
                self._synced.discard(wid)
                self._wake.set()
            self.events.append_worker(
                worker_id=wid, region=region, state=state, previous=before, timestamp=now
            )
            if self._on_worker is not None:
                self._on_worker(wid, state, before)

    async def sync_round(self) -> None:
        """Compare every worker's digest with the view's; re-list the workers that differ.

        A small cluster is asked at once on the all-workers subject (a worker not heard of yet
        answers too). A large one is asked ``SYNC_SLICE`` workers at a time, each on its own
        subject, so that neither the workers' side nor this event loop takes a burst of
        thousands of digests at once while events are flowing."""
        started_ms = self._clock.now_ms()
        live = sorted(wid for wid, _, state in self._workers.states() if state != WorkerState.DOWN)
        answered: set[str] = set()
        suspects: set[str] = set()
        if len(live) <= SYNC_SLICE:
            replies = await self._client.ask_all(
                DIGEST, DigestCommand(), expect=len(live) or None, timeout=self._timeout
            )
            await self._compare(replies, self.store.digests(), answered, suspects, started_ms)
        else:
            for at in range(0, len(live), SYNC_SLICE):
                part = live[at : at + SYNC_SLICE]
                replies = await self._client.call_each(
                    part, DIGEST, DigestCommand(), timeout=self._timeout
                )
                mine = self.store.digests(part)
                await self._compare(replies, mine, answered, suspects, started_ms)
        self._suspects = suspects
        self.store.prune(destroyed_before=started_ms - TOMBSTONE_TTL_MS)
        self._rounds += 1
        if all(w in answered for w in live):
            self._as_of_ms = started_ms

    async def _compare(
        self,
        replies: list[WorkerDigest],
        mine: dict[str, str],
        answered: set[str],
        suspects: set[str],
        started_ms: int,
    ) -> None:
        """Check digest replies against the view's own (``mine``); re-list a worker that still
        differs from the last round (one difference may be events in flight)."""
        empty = machines_digest([])
        for i, digest in enumerate(replies):
            if i % 100 == 99:
                await asyncio.sleep(0)  # many digests must not stall the events
            wid = digest.worker_id
            answered.add(wid)
            if wid in self._relist:
                if await self._resync(wid, before=started_ms):
                    self._relist.discard(wid)
                    self._synced.add(wid)
            elif digest.digest == mine.get(wid, empty):
                self._synced.add(wid)
            elif wid in self._synced and wid not in self._suspects:
                suspects.add(wid)  # maybe events in flight: re-list it if it still differs
            elif await self._resync(wid, before=started_ms):
                self._synced.add(wid)

    async def _resync(self, worker_id: str, *, before: int) -> bool:
        try:
            machines = await self._client.call(
                worker_id, LIST, ListCommand(), timeout=self._timeout
            )
        except (SouqError, ValueError) as exc:
            log.info("the view could not list worker %s: %s", worker_id, exc)
            return False
        self._tell_missed(machines)
        held = self.store.machine_ids(worker_id) if self._on_change is not None else []
        changed = self.store.reconcile_worker(worker_id, machines, before=before)
        if self._on_change is not None:
            for machine_id in {*held, *(m.id for m in machines)}:
                self._on_change(machine_id)
        if changed:
            log.info("anti-entropy: %d machine rows of worker %s healed", changed, worker_id)
        return True

    def _tell_missed(self, machines: list[Machine]) -> None:
        """Append to the event log the events of these records it never had, oldest first."""
        told = 0
        for machine in machines:
            for event in self._seen.missed(machine):
                self._seen.first_time(machine.id, event)
                self.events.append_machine(
                    machine_id=machine.id,
                    app=machine.app,
                    worker_id=machine.worker_id,
                    region=machine.region,
                    event=event,
                )
                told += 1
        if told:
            log.info("anti-entropy: %d machine events the stream had missed", told)

    async def resync(self) -> None:
        """After a NATS outage events may be lost: sync every worker again before serving lists
        from the view (until then lists ask the workers)."""
        self._synced.clear()
        self._suspects.clear()
        self._wake.set()

    def resync_worker(self, worker_id: str) -> None:
        """The worker lost the bus and is back (or its agent restarted): re-list it in the next
        round, which starts now, whatever its digest says."""
        self._relist.add(worker_id)
        self._synced.discard(worker_id)
        self._wake.set()

    def wake(self) -> None:
        """Run a sync round now (tests; a broker that reconnected to NATS)."""
        self._wake.set()
