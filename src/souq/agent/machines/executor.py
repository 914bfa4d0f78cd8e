"""The executor is the engine under the machine commands, and the only writer of machine state.

Every command is an operation (:mod:`souq.agent.state.operations`). The executor's one step
primitive, :meth:`Executor.apply`, writes the machine's transition (checked by
:mod:`souq.agent.machines.lifecycle`), its event and the operation's step in one transaction, then
updates memory, wakes waiters and queues the event for the bus; :meth:`Executor.execute` then runs
the step's actions. Actions are synchronous (a ``Popen``, a signal, a timer), so nothing interleaves
between a command's checks and its writes. Exits arrive from the supervisor's watchers
(:mod:`souq.agent.machines.exits`): an exit an operation waits for advances it; any other goes
through the restart policy.

After an agent restart, :meth:`Executor.recover` re-adopts running processes, resumes unfinished
operations from their last logged step, and reports the exits of processes that died meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import signal as _signal
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Unpack

from souq.agent.capacity.admission import Admission, reserves
from souq.agent.capacity.ports import PortPool
from souq.agent.machines import exits, lifecycle, machine_network, recovery
from souq.agent.machines.checks import MachineChecks
from souq.agent.machines.faults import FaultPoint
from souq.agent.machines.images import AgentImages, Pulled, image_of, image_source
from souq.agent.machines.launch import Pulls, machine_spec, pulled_record
from souq.agent.machines.network_slots import NetworkSlots
from souq.agent.machines.process_steps import ProcessSteps
from souq.agent.machines.restart import Backoff
from souq.agent.machines.secrets import AgentSecrets
from souq.agent.machines.supervisor import Supervisor
from souq.agent.machines.table import MachineTable
from souq.agent.state.events import PUBLISHED, Event
from souq.agent.state.machine_columns import SPEC_FIELDS  # written by a statement of their own
from souq.agent.state.operations import Action, OpKind, OpState, advance
from souq.agent.state.records import (
    RECENT_EVENTS,
    MachineRow,
    Op,
    OpParams,
    OpStep,
    Source,
    checked_params,
)
from souq.agent.state.store import Store
from souq.agent.volumes.worker_volumes import AgentVolumes
from souq.clock import Clock
from souq.drivers.base import Driver, ExitStatus, Handle, SpawnError
from souq.errors import SouqError
from souq.ids import new_request_id
from souq.market.preemption import JobRuns
from souq.model.choices import EventType
from souq.model.machine import MachineEvent, MachineState
from souq.model.protocol import MachineEventMessage
from souq.model.resources import Resources
from souq.network.addresses import AddressPool, private_address
from souq.network.links import WorkerNetwork

__all__ = ["Executor", "Op", "Source"]

S = MachineState
# Events whose message carries the machine's record: what the event alone does not say (a new
# machine; a config, metadata or cordon changed in place) reaches every view with it.
_WITH_RECORD = frozenset(
    {EventType.LAUNCH, EventType.UPDATE, EventType.METADATA, EventType.CORDON, EventType.UNCORDON}
)


class Executor(MachineTable, ProcessSteps):
    def __init__(
        self,
        *,
        worker_id: str,
        region: str,
        store: Store,
        driver: Driver,
        backoff: Backoff,
        clock: Clock,
        on_event: Callable[[MachineEventMessage], None],
        admission: Admission,
        ports: PortPool | None = None,
        advertise: str = "127.0.0.1",
        network: WorkerNetwork | None = None,
        images: AgentImages | None = None,
        secrets: AgentSecrets | None = None,
        volumes: AgentVolumes | None = None,
        fault: FaultPoint | None = None,
    ) -> None:
        """``network``: the worker's private network (its machines' namespaces and rules;
        None: machines share the host's network), started by the agent; ``volumes``: this
        worker's (not a hollow one's); ``fault``: crash tests only
        (:mod:`souq.agent.machines.faults`)."""
        rows = store.load_machines()
        super().__init__(worker_id, rows)
        self.region = region
        self.store = store
        self.driver = driver
        self._clock = clock
        self._on_event = on_event
        # Health checks of started machines, run here; their statuses are on the records.
        self.checks = MachineChecks(self._notify)
        self.check_statuses = self.checks.statuses
        # The image cache, and the pulls that spawns wait for; every machine pins its image.
        self.images = images
        self.pulls = Pulls(images) if images is not None else None
        self.secrets = secrets  # app secrets, opened into a machine's env at each spawn
        self.admission = admission  # the ledger: reservations are recorded there too
        self.ports = ports or PortPool()  # host ports, given at claims (souq.agent.capacity.ports)
        self.advertise = advertise
        # Where a proxy of another host reaches a private-network machine: the advertise
        # address, forwarded into the machine (an IPv4 one that is not loopback; else none).
        self.edge_host = network.edge_host if network is not None else ""
        # Private addresses, given at claims (souq.network), when the worker has the network.
        self.addresses = AddressPool(worker_id) if network is not None else None
        self.network = network  # their namespaces and rules
        # Machines of the private network made ahead of their claims, to start warm.
        self.network_slots = (
            NetworkSlots(driver, network, self.addresses)
            if network is not None and self.addresses is not None
            else None
        )
        # The batch jobs running here, which preemption may displace (the agent's, if it runs
        # jobs: souq.agent.machines.evictions).
        self.job_runs: JobRuns | None = None
        # Machines that gave their reservation back (failed, or stopped or being destroyed since).
        self.unreserved: set[str] = store.unreserved()
        for r in (r for r in rows if r.state is not S.DESTROYED):
            if r.gpu_ids and r.id not in self.unreserved:
                admission.adopt_gpus(r.resources, r.gpu_ids)
            if r.address is not None and r.address.private_ip and self.addresses is not None:
                self.addresses.restore(r.id, private_address(r.address))
                self.ports.restore(r.id, r.address.edge_ports.values())
            elif r.address is not None:
                self.ports.restore(r.id, r.address.ports.values())
            if images is not None and (ref := image_of(r.placement)) is not None:
                images.pin(ref)
        self._handles: dict[str, Handle] = {}
        # Suspended machines' processes: frozen by the driver, thawed before any signal.
        self._frozen: set[str] = {r.id for r in rows if r.state is S.SUSPENDED}
        self._ops: dict[str, Op] = {}
        self._ran_since: dict[str, float] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._unsynced = False  # a claim was recorded and is not yet durable (see create)
        self.changes = 0  # grows with every step and every operation's progress
        self.fault = fault
        self.volumes = volumes
        self.supervisor = Supervisor(
            driver,
            backoff,
            on_exit=functools.partial(exits.on_exit, self),
            on_kill_due=functools.partial(exits.on_kill_due, self),
            on_restart_due=functools.partial(exits.on_restart_due, self),
        )

    # -- queries -------------------------------------------------------------------------------

    @property
    def allocated(self) -> Resources:
        """What the machines reserve (quotes' holds not included)."""
        return self.admission.reserved

    def current_op(self, machine_id: str) -> Op | None:
        """The operation in progress on a machine, if any (at most one at a time)."""
        return self._ops.get(machine_id)

    def ops(self) -> list[Op]:
        return list(self._ops.values())

    def handle(self, machine_id: str) -> Handle | None:
        return self._handles.get(machine_id)

    # -- recording ---------------------------------------------------------------------------

    def create(
        self,
        row: MachineRow,
        op: Op,
        op_event: Event,
        op_state: OpState,
        *,
        quote_id: str | None = None,
        durable: bool = True,
    ) -> str | None:
        """Record a new machine, its reservation, its events and its operation's first step in
        one transaction (admission judged it before; a quote's hold is marked used). Returns
        the id of the machine already made for the same request id instead, if there is one.

        The transaction reaches the operating system before anything runs, and the disk before
        the claim is answered: it commits unsynced, and :meth:`sync` (called by the caller at
        the latest) makes it durable. A spawn syncs while souq-waiter forks, so the fsync and
        the fork overlap. ``durable=False``: the caller syncs the store itself (a batch, once
        for all its claims)."""
        now = row.created_at
        log_step = OpStep(op.id, row.id, op.kind, op_state, op_event, now, op.params)
        existing = self.store.claim(row, [log_step], quote_id=quote_id, durable=False)
        if existing is not None:
            return existing
        self._unsynced = durable
        if self.fault is not None:
            self.fault.after_step(op.kind, op_state)
        self._rows[row.id] = row
        self._by_request[row.request_id] = row.id
        self._live_by_app[row.app] += 1
        if self.images is not None and (ref := image_of(row.placement)) is not None:
            self.images.pin(ref)
        self.admission.reserve(row.resources, row.gpu_ids)
        for event in reversed(row.events):
            self._publish(row, event)
        self._op_reached(op, op_state)
        return None

    # -- the step primitive --------------------------------------------------------------------

    def apply(
        self,
        machine_id: str,
        *,
        event: Event | None = None,
        type: EventType | None = None,
        published: bool = True,
        source: Source = "agent",
        status: ExitStatus | None = None,
        signal: str | None = None,
        message: str | None = None,
        op: Op | None = None,
        op_event: Event | None = None,
        durable: bool = True,
        give_back: bool = False,
        **changes: Any,
    ) -> tuple[Action, ...]:
        """One step: the machine's transition, its event record and the operation's step (if
        ``op``), written in one transaction; then memory, waiters and the bus. Returns the
        operation step's actions for :meth:`execute`.

        A happening is named once (:mod:`souq.agent.state.events`): ``event`` is the machine's
        transition, or, when none is given, ``op_event`` is, if the life cycle takes it (the
        process ``spawned``, ``exited``, its files ``cleaned``). The record's type is
        ``type``, else what the event is published as (none for an operation's own steps);
        ``published=False``: no record.

        An exit ``status`` means the process is gone: the row forgets its pid and keeps its exit
        code, and the event's message says how it ended unless ``message`` says more.

        The reservation follows :func:`~souq.agent.capacity.admission.reserves`: a step into
        ``failed`` or ``destroyed`` releases it; a start of a machine that gave it back takes it
        again, if it fits (``insufficient_capacity`` else, and nothing is written). ``give_back``:
        the machine gives its reservation back whatever its state (it was displaced: a start takes
        it again, as for a failed one)."""
        if status is not None:
            message = status.describe() if message is None else message
            changes = {"pid": None, "pid_start_time": None, "exit_code": status.code, **changes}
        row = self._rows[machine_id]
        if event is None and op_event in lifecycle.EVENTS:
            event = op_event
        state = lifecycle.transition(row.state, event, machine_id=row.id) if event else row.state
        step = advance(op.kind, op.state, op_event) if op is not None and op_event else None
        happening = event or op_event
        if type is None and published and happening is not None:
            type = PUBLISHED.get(happening)
        now = self._clock.now_ms()
        recorded: list[MachineEvent] = []
        if type is not None:
            recorded.append(
                MachineEvent(
                    type=type,
                    status=state,
                    source=source,
                    timestamp=now,
                    exit_code=status.code if status else None,
                    signal=signal or (status.signal if status else None),
                    message=message,
                    oom_killed=status is not None and status.oom_killed,
                )
            )
        new = replace(
            row,
            state=state,
            updated_at=now,
            events=(*recorded, *row.events)[:RECENT_EVENTS],
            **changes,
        )
        steps = []
        if op is not None and step is not None and op_event is not None:
            steps.append(OpStep(op.id, row.id, op.kind, step.next, op_event, now, op.params))
        spec = not SPEC_FIELDS.isdisjoint(changes)  # an update, or a pull's record
        held = row.id not in self.unreserved
        holds = reserves(held, state) and not give_back
        release, regain = held and not holds, holds and not held
        if regain:
            self.admission.check_regain(new.resources, new.gpu_ids, now)
        resize = spec and new.resources != row.resources and held and holds
        reserve = new.resources if resize or regain else None
        self.store.commit(
            new,
            recorded,
            steps,
            release=release,
            durable=durable,
            spec=spec,
            reserve=reserve,
            regain=regain,
        )
        if durable:
            self._unsynced = False  # a synced commit syncs every write before it
        if self.fault is not None and steps:
            self.fault.after_step(steps[0].kind, steps[0].state)
        self._rows[row.id] = new
        if holds or state is S.DESTROYED:
            self.unreserved.discard(row.id)
        else:
            self.unreserved.add(row.id)
        self._account(row, new, release=release, resized=resize, regain=regain, spec=spec)
        self.checks.follow(new)
        if op is not None and step is not None:
            self._op_reached(op, step.next)
        self._notify(row.id)
        for record in recorded:
            self._publish(new, record)
        return step.actions if step else ()

    def _account(
        self,
        row: MachineRow,
        new: MachineRow,
        *,
        release: bool,
        resized: bool,
        regain: bool,
        spec: bool,
    ) -> None:
        """What a committed step changes beyond the row: ports, pins, the app count and the
        ledger."""
        if new.state is S.DESTROYED and row.state is not S.DESTROYED:
            machine_network.give_back(self, row.id)
            if self.images is not None and (ref := image_of(row.placement)) is not None:
                self.images.release(ref)
            self._live_by_app[row.app] -= 1
            if not self._live_by_app[row.app]:
                del self._live_by_app[row.app]
        if release or resized:
            self.admission.release(row.resources, row.gpu_ids)
        if resized or regain:
            self.admission.reserve(new.resources, new.gpu_ids)
        if spec and self.images is not None:
            self.images.repin(image_of(row.placement), image_of(new.placement))

    def sync(self) -> None:
        """Make a claim recorded by :meth:`create` durable, if it is not yet."""
        if self._unsynced:
            self.store.sync()
            self._unsynced = False

    def _op_reached(self, op: Op, state: OpState) -> None:
        op.state = state
        self.changes += 1
        if state is OpState.DONE:
            if self._ops.get(op.machine_id) is op:
                del self._ops[op.machine_id]
            if not op.done.done():
                op.done.set_result(None)
        else:
            self._ops[op.machine_id] = op

    def step(self, op: Op, op_event: Event, **apply_args: Any) -> None:
        """One step of ``op`` (:meth:`apply` with ``apply_args``), then its actions."""
        self.execute(op, self.apply(op.machine_id, op=op, op_event=op_event, **apply_args))

    def execute(self, op: Op, actions: tuple[Action, ...]) -> None:
        at = op.state
        for action in actions:
            if op.state is not at:
                return  # an action already moved the operation on (e.g. the process was gone)
            mid = op.machine_id
            if action is Action.SPAWN:
                self._spawn(op)
            elif action is Action.ADOPT_OR_SPAWN:
                self._adopt_or_spawn(op)
            elif action is Action.SEND_SIGNAL:
                self._send(op, _signal.Signals[op.params["signal"]])
            elif action is Action.SEND_KILL:
                self._send(op, _signal.SIGKILL)
            elif action is Action.ARM_KILL_TIMER:
                self.supervisor.arm_kill(mid, float(op.params["timeout_s"]))
            elif action is Action.ARM_DRAIN_TIMER:  # the stop's timer: first the drain's end
                self.supervisor.arm_kill(mid, float(op.params["drain_s"]))
            elif action is Action.CANCEL_RESTART:
                self.supervisor.cancel_restart(mid)
            elif action is Action.CLEANUP:
                self._cleanup(op)

    # -- actions -------------------------------------------------------------------------------

    def _to_starting(self, op: Op) -> MachineRow:
        row = self._rows[op.machine_id]
        if row.state is not S.STARTING:  # a restart whose stop has just finished
            self.apply(row.id, event=Event.START, source=op.source)
        return self._rows[op.machine_id]

    def _spawn(self, op: Op) -> None:
        row = self._to_starting(op)
        ref = image_of(row.placement)
        image = None if ref is None or self.images is None else self.images.ready(ref)
        if ref is not None and image is None:  # spawned once the image is here, or failed
            self.sync()
            self._pull(op, ref)
            return
        # A machine made (or last updated) by a token that may not read its app's secrets
        # starts without them, at every start, whoever starts it (docs/security.md).
        secrets = None if row.skip_secrets else self.secrets
        if secrets is not None and not secrets.ready:  # spawned once they are read
            self.sync()
            secrets.when_ready(lambda: self._spawn_if_waiting(op))
            return
        try:
            values = secrets.for_machine(row.id, row.app) if secrets is not None else None
        except SouqError as exc:
            self._spawn_failed(op, str(exc))
            return
        mounts = self.volumes.host_mounts(row.config) if self.volumes is not None else ()
        spec = machine_spec(row, self.worker_id, image, values, mounts)
        try:  # its own network namespace, made at its first start (or ahead) and kept
            spec, private = machine_network.joined(self, row, spec)
        except OSError as exc:
            self._spawn_failed(op, f"cannot make the machine's network: {exc}")
            return
        try:
            handle = self.driver.start(spec, meanwhile=self.sync)
        except SpawnError as exc:
            self._spawn_failed(op, str(exc))
            return
        self._spawned(op, handle, watch=True)
        if private is not None:
            machine_network.started(self, row, spec, private)

    def _spawn_if_waiting(self, op: Op) -> None:
        if self._ops.get(op.machine_id) is op and op.state is OpState.SPAWNING:
            self._spawn(op)  # else destroyed or stopped meanwhile

    def _spawn_failed(self, op: Op, message: str) -> None:
        self.step(op, Event.SPAWN_FAILED, message=message, pid=None, pid_start_time=None)

    def _pull(self, op: Op, ref: str) -> None:
        if self.pulls is None:
            self._spawn_failed(op, f"image {ref}: this worker keeps no image cache")
            return

        def pulled(outcome: Pulled | Exception) -> None:
            if self._ops.get(op.machine_id) is not op or op.state is not OpState.SPAWNING:
                return  # destroyed meanwhile
            if isinstance(outcome, Exception):
                self._spawn_failed(op, f"image {ref}: {outcome}")
                return
            placement, message = pulled_record(self._rows[op.machine_id], outcome)
            self.apply(op.machine_id, type=EventType.PULL, message=message, placement=placement)
            self._spawn(op)

        source = image_source(self._rows[op.machine_id].placement)
        self.pulls.start(op.machine_id, ref, pulled, source=source)

    def _spawned(self, op: Op, handle: Handle, *, watch: bool, message: str | None = None) -> None:
        mid = op.machine_id
        self._handles[mid] = handle
        if watch:  # a fresh process (an adopted one keeps the time it was adopted)
            self._ran_since[mid] = self._clock.monotonic()
        try:
            actions = self.apply(
                mid,
                type=op.spawn_type,
                message=message,
                op=op,
                op_event=Event.SPAWNED,
                durable=False,  # lost only with the process itself: see souq.agent.state.store
                pid=handle.pid,
                pid_start_time=handle.start_time,
                exit_code=None,
            )
        except SouqError:
            # Not recorded: leave no unrecorded process behind.
            self._handles.pop(mid, None)
            self.driver.signal(handle, _signal.SIGKILL)
            raise
        if watch:
            self.supervisor.watch(mid, handle)
        self.execute(op, actions)

    def _adopt_or_spawn(self, op: Op) -> None:
        handle = self._handles.get(op.machine_id)
        if handle is None:
            self._spawn(op)
        else:  # adopted by recover(), already watched
            self._to_starting(op)
            self._spawned(op, handle, watch=False, message="adopted after an agent restart")

    # -- what the supervisor reports (souq.agent.machines.exits) -----------------------------------

    def process_gone(self, machine_id: str) -> float:
        """Forget the machine's exited process (its handle, its freeze, its kill timer): how
        long it ran, in seconds."""
        self._handles.pop(machine_id, None)
        self._frozen.discard(machine_id)
        self.supervisor.disarm_kill(machine_id)
        now = self._clock.monotonic()
        return now - self._ran_since.pop(machine_id, now)

    def drop_handle(self, machine_id: str) -> None:
        self._handles.pop(machine_id, None)

    # -- recovery and shutdown -----------------------------------------------------------------

    def recover(self) -> None:
        """After an agent restart: see :mod:`souq.agent.machines.recovery`."""
        recovery.recover(self)

    def adopt(self, machine_id: str, handle: Handle) -> None:
        """A process found running at an agent restart is the machine's: watch it."""
        self._handles[machine_id] = handle
        self._ran_since[machine_id] = self._clock.monotonic()
        self.supervisor.watch(machine_id, handle)
        machine_network.keep_ahead(self, self._rows[machine_id])

    def resume(self, last: OpStep) -> None:
        """Go on with an operation the op log left unfinished, from its last step."""
        op = Op.resumed(last)
        self._ops[op.machine_id] = op
        self.step(op, Event.RECOVER)

    def exited_unwatched(self, machine_id: str) -> None:
        """The machine's process died while no agent watched: its exit, as the driver kept it."""
        exits.on_exit(self, machine_id, exits.last_exit(self.driver, machine_id))

    async def shutdown(self) -> None:
        """Stop watching: machines keep running, for the next agent to re-adopt. (To stop them
        first, see :meth:`souq.agent.machines.commands.Commands.stop_all`.) A pull under way stops:
        the next agent resumes the spawn."""
        if self.pulls is not None:
            await self.pulls.aclose()
        await self.checks.aclose()
        await self.supervisor.aclose()
        self.driver.close()

    # -- helpers -------------------------------------------------------------------------------

    def new_op(self, kind: OpKind, machine_id: str, **params: Unpack[OpParams]) -> Op:
        """A new operation of ``kind`` on the machine, with the parameters its kind takes."""
        return Op(new_request_id(), kind, machine_id, checked_params(kind, params))

    def changed(self, machine_id: str) -> asyncio.Event:
        event = self._changed.get(machine_id)
        if event is None:
            event = self._changed[machine_id] = asyncio.Event()
        return event

    def _notify(self, machine_id: str) -> None:
        self.changes += 1
        event = self._changed.pop(machine_id, None)
        if event is not None:
            event.set()

    def _publish(self, row: MachineRow, event: MachineEvent) -> None:
        self._on_event(
            MachineEventMessage(
                machine_id=row.id,
                app=row.app,
                worker_id=self.worker_id,
                region=row.region,
                state=row.state,
                event=event,
                machine=row.to_machine(self.worker_id) if event.type in _WITH_RECORD else None,
            )
        )
