"""The machine commands a broker sends (claim, start, stop, restart, signal, destroy): each checks
the request against the life-cycle table, then begins an operation on the
:class:`~souq.agent.machines.executor.Executor`, which logs and runs its steps. The reads (wait,
logs, ops, events) are :class:`~souq.agent.machines.reads.MachineReads`'.

Every command takes the ``app`` the caller believes the machine belongs to; a machine of another
app is :class:`~souq.errors.NotFound`, as if it did not exist.
"""

from __future__ import annotations

import asyncio
import contextlib

from souq.agent.capacity.admission import HeldQuote
from souq.agent.capacity.ports import edge_ports
from souq.agent.machines import evictions, launch, lifecycle, machine_network
from souq.agent.machines.executor import Executor
from souq.agent.machines.images import image_of
from souq.agent.machines.leases import Leases
from souq.agent.machines.reads import MachineReads
from souq.agent.machines.steps import begin_destroy
from souq.agent.state.events import Event
from souq.agent.state.operations import OpKind, advance
from souq.agent.state.records import MachineRow, Source
from souq.clock import Clock
from souq.errors import (
    ClaimRefused,
    Conflict,
    IdempotencyConflict,
    IllegalTransition,
    InsufficientCapacity,
    InvalidInput,
)
from souq.ids import new_instance_id, new_machine_id
from souq.market.preemption import Eviction
from souq.model.app import DEFAULT_ORG
from souq.model.choices import EventType
from souq.model.image import ImageRecord
from souq.model.machine import (
    Machine,
    MachineConfig,
    MachineEvent,
    MachineState,
    normalise_signal,
)
from souq.model.placement import Placement
from souq.model.protocol import (
    ClaimRequest,
    StopCommand,
    UpdateCommand,
)
from souq.model.reasons import Reason
from souq.model.resources import Resources
from souq.model.services import MachineAddress
from souq.network.addresses import UNKNOWN_NETWORK, network_of
from souq.placement import gpus

__all__ = ["Commands"]

S = MachineState
_RESTARTABLE = (S.STARTED, S.SUSPENDED, S.STOPPED, S.CREATED, S.FAILED, S.STARTING)
_RUNNING = (S.STARTED, S.SUSPENDED, S.STOPPING)  # a process is there (frozen or not)
_UP = (S.STARTED, S.SUSPENDED, S.STARTING)  # what stopping every machine stops
_FINAL = (Reason.WRONG_REGION, Reason.CORDONED)  # refusals that displacing machines does not change


class Commands(MachineReads):
    def __init__(self, executor: Executor, clock: Clock) -> None:
        self._ex = executor
        self._clock = clock
        self.leases = Leases(executor.store, clock)

    def claim(
        self,
        req: ClaimRequest,
        *,
        quote: HeldQuote | None = None,
        durable: bool = True,
        admitted: bool = False,
    ) -> Machine:
        """Reserve capacity and record the machine in one transaction, then (unless ``skip_launch``)
        start it: the reply shows ``started``, or ``failed``. A claim for a known request id returns
        that machine (same body) or is an idempotency conflict. Admission judges the claim first
        (:mod:`souq.agent.capacity.admission`), with ``quote``'s hold when it names one;
        ``admitted``: it already did (a batch, judged as a whole). A claim that does not fit but may
        displace (``req.preempt``) displaces the victims admission chose
        (:mod:`souq.agent.machines.evictions`) once its own record is written (a claim refused or
        failed before that displaces nobody), in the same turn of the event loop as that record:
        no other claim sees the room in between."""
        ex = self._ex
        known = ex.machine_for_request(req.request_id)
        if known is not None:
            return self._claimed_before(req, known)
        now = self._clock.now_ms()
        want = req.config.guest.resources()
        eviction = None
        if not admitted:
            eviction = self._admit(req, want, now, quote)
        self._check_mounts(req.app, req.config)
        config, placement = self._driver_noted(req.config, req.placement)
        placement = self._image_noted(config, req.image, placement, req.request_id, req.region)
        machine_id, address = self._id_and_address(req, config, placement)
        victims = []
        try:
            if eviction is not None and eviction.victims:
                victims = evictions.told(
                    eviction, by=machine_id, app=req.app, claimant=config.priority_class
                )
                placement = placement or Placement(request_id=req.request_id, region=req.region)
                placement = placement.model_copy(update={"preempted": victims})
                gpu_ids = self._gpus_once_evicted(want, eviction)
            else:
                gpu_ids = ex.admission.gpus_for(want, now, quote_id=req.quote_id)
        except BaseException:
            machine_network.give_back(ex, machine_id)
            raise
        op = ex.new_op(OpKind.CREATE, machine_id, source="user", type=EventType.START)
        events = [_made(EventType.LAUNCH, S.CREATED, now)]
        if req.config.standbys:  # a standby waits, stopped, until a primary's worker is lost
            op_event, state = Event.SKIP, lifecycle.transition(S.CREATED, Event.STOP)
            events.append(_made(EventType.STANDBY, state, now))
        elif req.skip_launch:
            op_event, state = Event.SKIP, S.CREATED
        else:
            op_event, state = Event.BEGIN, lifecycle.transition(S.CREATED, Event.START)
            events.append(_made(EventType.START, state, now))
        step = advance(op.kind, op.state, op_event)
        row = MachineRow(
            id=op.machine_id,
            app=req.app,
            name=req.name or op.machine_id,
            region=req.region,
            request_id=req.request_id,
            body_hash=req.body_hash,
            state=state,
            config=config,
            placement=placement,
            created_at=now,
            updated_at=now,
            events=tuple(reversed(events)),
            address=address,
            instance_id=new_instance_id(now),
            gpu_ids=gpu_ids,
            skip_secrets=req.skip_secrets,
        )
        try:
            existing = ex.create(
                row, op, op_event, step.next, quote_id=req.quote_id, durable=durable
            )
        except BaseException:
            machine_network.give_back(ex, row.id)
            raise
        if existing is not None:
            machine_network.give_back(ex, row.id)
            return self._claimed_before(req, existing)
        # Displaced once the new machine is recorded (its ledger over its capacity until then,
        # within this turn of the loop: no other claim sees it), so that a claim that fails
        # leaves every victim as it was; stopped before the new machine's process starts.
        evictions.evict(ex, victims, by=row.id, app=req.app)
        if ex.volumes is not None and req.config.mounts:
            ex.volumes.attach(row.id, req.config)
        ex.execute(op, step.actions)
        ex.sync()  # if the spawn did not (skip_launch, or it failed before its fork)
        return ex.machine(row.app, row.id)

    def _admit(
        self, req: ClaimRequest, want: Resources, now: int, quote: HeldQuote | None
    ) -> Eviction | None:
        """Admission's word on a new machine: None (it fits), the victims it displaces, or the
        refusal raised."""
        admission = self._ex.admission
        try:
            admission.check_claim(req.region, want, now, quote=quote)
        except ClaimRefused as exc:
            if not req.preempt or quote is not None or exc.details.get("reason") in _FINAL:
                raise
            klass = req.config.priority_class
            return admission.check_preempting_claim(
                req.region,
                want,
                now,
                claimant=klass,
                max_victims=req.preempt,
                candidates=evictions.candidates(self._ex, klass),
            )
        return None

    def _gpus_once_evicted(self, want: Resources, eviction: Eviction) -> tuple[int, ...]:
        """The GPUs a machine of ``want`` gets on the room its victims give back, chosen before
        they go (:class:`InsufficientCapacity` if none would do: nobody is displaced)."""
        got = gpus.pick(want, eviction.gpu_free) if want.wants_gpu else ()
        if got is None:
            raise InsufficientCapacity(
                f"no room on the GPUs of worker {self._ex.worker_id}, even with its victims gone",
                details={"reason": Reason.INSUFFICIENT_GPUS},
            )
        return got

    def _check_mounts(self, app: str, config: MachineConfig, machine_id: str | None = None) -> None:
        """The volumes ``config`` mounts are here and free (or ``machine_id``'s already)."""
        volumes = self._ex.volumes
        if volumes is not None:
            volumes.check_mounts(app, config, machine_id)
        elif config.mounts:
            raise InvalidInput(f"mounts: worker {self._ex.worker_id} keeps no volumes")

    def _driver_noted(
        self, config: MachineConfig, placement: Placement | None
    ) -> tuple[MachineConfig, Placement | None]:
        """The config with the driver it runs under here (a config that leaves it out gets
        the worker's default: isolated where this worker can isolate), and the placement
        record saying which, and why not isolated when it could not be."""
        driver, why_not = launch.default_driver(self._ex.driver)
        chosen = config.driver or driver
        checked = config.model_copy(update={"driver": chosen})
        launch.check_command(self._ex.driver, checked)
        if placement is not None:
            note = why_not if config.driver is None and chosen != "sandbox" else None
            placement = placement.model_copy(update={"driver": chosen, "isolation": note})
        return checked, placement

    def _image_noted(
        self,
        config: MachineConfig,
        image: ImageRecord | None,
        placement: Placement | None,
        request_id: str,
        region: str,
    ) -> Placement | None:
        """A claim's (or an update's) placement record, saying (for a machine of an image) what
        this worker has of the image."""
        if config.image is None:
            return placement
        if image is None:
            raise InvalidInput(
                f"config.image: the request names image {config.image} without its record",
                hint="create and update machines through a broker, which resolves the image",
            )
        placement = placement or Placement(request_id=request_id, region=region)
        images = self._ex.images
        return placement if images is None else images.claimed(image, placement)

    def _id_and_address(
        self, req: ClaimRequest, config: MachineConfig, placement: Placement | None
    ) -> tuple[str, MachineAddress | None]:
        """A new machine's id (a slot's made ahead for it, if it takes one) and address."""
        ex = self._ex
        machine_id = self._slot_id(req, config, placement) or new_machine_id()
        try:
            return machine_id, self._address(machine_id, config, req.network)
        except BaseException:
            if ex.network_slots is not None:
                ex.network_slots.unused(machine_id)
            raise

    def _slot_id(
        self, req: ClaimRequest, config: MachineConfig, placement: Placement | None
    ) -> str | None:
        """The id of the machine a slot was made ahead for that this claim's machine takes
        (:mod:`souq.agent.machines.network_slots`): one of the private network, of an image,
        started at once; None: it starts cold, with an id of its own."""
        ex = self._ex
        slots = ex.network_slots
        if slots is None or req.skip_launch or req.config.standbys or req.config.mounts:
            return None
        if config.driver != "sandbox" or not config.sandbox.network:
            return None
        if req.network == UNKNOWN_NETWORK:
            return None
        return slots.take(req.network or network_of(DEFAULT_ORG), image_of(placement))

    def _address(
        self, machine_id: str, config: MachineConfig, network: str
    ) -> MachineAddress | None:
        """Where the machine is reached. On a worker with a private network, a sandboxed
        machine's addresses on ``network`` (:mod:`souq.network`; its own again if it has them)
        and its internal ports as they are: it has a network namespace of its own (not one
        that asked for no network, ``sandbox.network: false``: it sees only ``lo``). Otherwise
        host ports for its internal ports (:class:`ClaimRefused` ``no_ports`` when the worker's
        range has too few); an exec machine shares the host's network, and has no private
        address."""
        internal = config.internal_ports()
        ex = self._ex
        if ex.addresses is not None and config.driver == "sandbox" and config.sandbox.network:
            if network == UNKNOWN_NETWORK:
                raise ClaimRefused(
                    "the app's private network is not known (its broker could not read the "
                    "app's record) and every sandboxed machine here gets a private address",
                    hint="retry once JetStream answers, or use a worker without a private network",
                    details={"reason": Reason.NETWORK_UNKNOWN},
                )
            edge = ex.ports.take(machine_id, edge_ports(config)) if ex.edge_host else {}
            try:
                private = ex.addresses.take(machine_id, network or network_of(DEFAULT_ORG))
            except BaseException:
                ex.ports.give_back(machine_id)
                raise
            return MachineAddress(
                host=private.ip4,
                ports={port: port for port in internal},
                private_ip=private.ip6,
                ip4=private.ip4,
                network=private.network,
                edge_host=ex.edge_host if edge else "",
                edge_ports=edge,
            )
        if not internal:
            return None
        return MachineAddress(host=ex.advertise, ports=ex.ports.take(machine_id, internal))

    def _claimed_before(self, req: ClaimRequest, machine_id: str) -> Machine:
        row = self._ex.row_by_id(machine_id)
        if row.body_hash != req.body_hash:
            raise IdempotencyConflict.other_body(req.request_id, machine_id)
        return self._ex.shown(row)

    def start(self, app: str, machine_id: str) -> Machine:
        """Start a machine; a suspended one is resumed (thawed: the same process)."""
        ex = self._ex
        row = ex.row(app, machine_id)
        if row.state is S.SUSPENDED:
            ex.freeze(row.id, frozen=False, source="user")
            return ex.machine(app, machine_id)
        self._begin_start(row, "user")
        return ex.machine(app, machine_id)

    def start_scheduled(self, row: MachineRow, why: str) -> None:
        """A scheduled machine's start (:mod:`souq.agent.machines.schedule`): a start, by the agent,
        its event saying why (``schedule daily: due at …``)."""
        self._begin_start(row, "agent", message=why)

    def _begin_start(self, row: MachineRow, source: Source, message: str | None = None) -> None:
        """Start a stopped machine: the start operation begun, by ``source``."""
        ex = self._ex
        lifecycle.transition(row.state, Event.START, machine_id=row.id)
        self._check_idle(row)
        op = ex.new_op(OpKind.START, row.id, source=source, type=EventType.START)
        # restarts=0: a start is a fresh start for the restart policy
        ex.step(op, Event.BEGIN, event=Event.START, source=source, restarts=0, message=message)

    def suspend(self, app: str, machine_id: str, *, source: Source = "user") -> Machine:
        """Freeze a started machine where it stands; :meth:`start` resumes it."""
        ex = self._ex
        row = ex.row(app, machine_id)
        self._check_idle(row)
        ex.freeze(row.id, frozen=True, source=source)
        return ex.machine(app, machine_id)

    def stop(self, cmd: StopCommand, *, source: Source = "user") -> Machine:
        """Send the stop signal (SIGKILL follows after ``cmd.timeout_s``) and answer at once:
        ``stopping``, or ``stopped`` when nothing was running."""
        ex = self._ex
        row = ex.row(cmd.app, cmd.machine_id)
        current = ex.current_op(row.id)
        if row.state is S.STOPPED or (current is not None and current.kind is OpKind.STOP):
            return ex.shown(row)  # stopped, or a stop is already under way
        if current is not None and ex.pulls is not None and ex.pulls.waiting(row.id):
            # Its start waits for its image: called off (the pull goes on, for the cache).
            ex.apply(row.id, op=current, op_event=Event.ABORT)
            current = None
        if current is not None and current.kind is OpKind.RESTART:
            raise IllegalTransition(
                f"machine {row.id} is restarting; it cannot be stopped now",
                hint="wait for the restart to finish, then stop it",
            )
        lifecycle.transition(row.state, Event.STOP, machine_id=row.id)
        self._check_idle(row)
        sig, timeout = _stop_params(row, cmd.signal, cmd.timeout_s)
        running = row.state in _RUNNING
        drain = _drain_s(row) if running else 0.0
        op = ex.new_op(
            OpKind.STOP, row.id, source=source, signal=sig, timeout_s=timeout, drain_s=drain
        )
        ex.step(
            op,
            (Event.DRAIN if drain else Event.BEGIN) if running else Event.IDLE,
            event=Event.STOP,
            source=source,
            signal=sig if running else None,
            message=f"out of rotation {drain:g}s before the signal" if drain else None,
        )
        return ex.machine(cmd.app, cmd.machine_id)

    async def restart(self, cmd: StopCommand) -> Machine:
        """Stop the machine if it runs, then start it again; answer once it has started."""
        ex = self._ex
        row = ex.row(cmd.app, cmd.machine_id)
        if row.state not in _RESTARTABLE:
            raise IllegalTransition(
                f"machine {row.id} is {row.state}; it cannot be restarted",
                hint="wait until it is stopped, then start it"
                if row.state is S.STOPPING
                else "it is gone; create a new machine",
            )
        self._check_idle(row)
        sig, timeout = _stop_params(row, cmd.signal, cmd.timeout_s)
        op = ex.new_op(
            OpKind.RESTART,
            row.id,
            source="user",
            type=EventType.RESTART,
            signal=sig,
            timeout_s=timeout,
            drain_s=_drain_s(row),
        )
        if row.state in (S.STARTED, S.SUSPENDED):
            begin = Event.DRAIN if _drain_s(row) else Event.BEGIN
            ex.step(op, begin, event=Event.STOP, type=EventType.RESTART, source="user", signal=sig)
        else:
            ex.step(
                op, Event.IDLE, event=Event.START, type=EventType.RESTART, source="user", restarts=0
            )
        await op.done
        return ex.machine(cmd.app, cmd.machine_id)

    async def update(self, cmd: UpdateCommand) -> Machine:
        """Replace the machine's config here, on its worker (a new ``instance_id``): its
        reservation grows only if the worker has the room (``insufficient_capacity`` else,
        nothing changed), its ports follow its services, its placement record its image. A
        machine that runs restarts with the new config (stopped with its old stop config); a
        stopped one starts, unless ``skip_launch``."""
        ex = self._ex
        row = ex.row(cmd.app, cmd.machine_id)
        if row.state not in _RESTARTABLE:
            raise IllegalTransition(
                f"machine {row.id} is {row.state}; it cannot be updated now",
                hint="wait until it is stopped or started, then update it",
            )
        self._check_idle(row)
        config = cmd.config
        now = self._clock.now_ms()
        if row.id not in ex.unreserved:  # (one that holds none is judged whole at its start)
            ex.admission.check_resize(row.resources, config.guest.resources(), now)
        self._check_mounts(row.app, config, row.id)
        config, placement = self._driver_noted(config, row.placement)
        placement = self._image_noted(config, cmd.image, placement, row.request_id, row.region)
        address = row.address
        if address is not None and address.private_ip and config.driver == "sandbox":
            ports = {port: port for port in config.internal_ports()}
            edge = address.edge_ports
            if ex.edge_host and list(edge) != edge_ports(config):
                ex.ports.give_back(row.id)
                try:
                    edge = ex.ports.take(row.id, edge_ports(config))
                except BaseException:
                    ex.ports.restore(row.id, address.edge_ports.values())
                    raise
            update = {"ports": ports, "edge_ports": edge, "edge_host": ex.edge_host if edge else ""}
            address = address.model_copy(update=update)
        elif config.internal_ports() != row.config.internal_ports():
            ex.ports.give_back(row.id)
            try:
                address = self._address(row.id, config, address.network if address else "")
            except BaseException:
                ex.ports.restore(row.id, row.address.ports.values() if row.address else ())
                raise
        instance = new_instance_id(now)
        ex.apply(
            row.id,
            type=EventType.UPDATE,
            source="user",
            message=f"config updated: instance {instance}",
            config=config,
            placement=placement,
            address=address,
            instance_id=instance,
            skip_secrets=cmd.skip_secrets,
        )
        if ex.volumes is not None:
            ex.volumes.attach(row.id, config)
        if row.state in _UP or not cmd.skip_launch:
            stop = row.config.stop_config
            again = StopCommand(
                app=row.app, machine_id=row.id, signal=stop.signal, timeout_s=stop.timeout_s
            )
            return await self.restart(again)
        return ex.machine(cmd.app, cmd.machine_id)

    def signal(self, app: str, machine_id: str, signal: str) -> Machine:
        ex = self._ex
        row = ex.row(app, machine_id)
        lifecycle.transition(row.state, Event.SIGNAL, machine_id=row.id)
        name = _signal_name(signal)
        if ex.handle(row.id) is None:
            raise IllegalTransition(
                f"machine {row.id} has no running process to signal", hint="start it first"
            )
        op = ex.new_op(OpKind.SIGNAL, row.id, source="user", signal=name)
        ex.step(op, Event.BEGIN, event=Event.SIGNAL, source="user", signal=name)
        return ex.machine(app, machine_id)

    async def destroy(
        self, app: str, machine_id: str, *, force: bool = False, graceful: bool = False
    ) -> Machine:
        """Destroy a machine and release its reservation. A running machine needs ``force``
        (it is killed first) or ``graceful`` (it is stopped first, with its stop config: out of
        rotation for its drain, its signal, SIGKILL after its timeout; the answer comes at
        once, ``destroying``, and the rest follows)."""
        ex = self._ex
        row = ex.row(app, machine_id)
        if graceful and row.state in _RUNNING and ex.current_op(row.id) is None:
            return self._retire(row)
        event = Event.FORCE_DESTROY if force else Event.DESTROY
        lifecycle.transition(row.state, event, machine_id=row.id)
        current = ex.current_op(row.id)
        if current is not None and current.kind is OpKind.DESTROY:
            await current.done
            return ex.machine(app, machine_id)
        if current is not None:  # a stop or restart waiting for its process: superseded
            ex.supervisor.disarm_kill(row.id)
            ex.apply(row.id, op=current, op_event=Event.ABORT)
        op_event = Event.BEGIN if ex.handle(row.id) else Event.IDLE
        op = begin_destroy(ex, row.id, op_event, event, source="user")
        await op.done
        self.leases.drop(row.id)
        return ex.machine(app, machine_id)

    def _retire(self, row: MachineRow) -> Machine:
        """A graceful destroy of a running machine: one operation, logged step by step."""
        ex = self._ex
        sig, timeout = _stop_params(row, None, None)
        drain = _drain_s(row)
        op = begin_destroy(
            ex,
            row.id,
            Event.DRAIN,
            Event.FORCE_DESTROY,
            source="user",
            message=f"stopping first ({sig}, {drain:g}s out of rotation before it)",
            signal=sig,
            timeout_s=timeout,
            drain_s=drain,
        )
        op.done.add_done_callback(lambda _: self.leases.drop(row.id))
        return ex.machine(row.app, row.id)

    def stop_every(self) -> list[str]:
        """Send every running machine its stop (each with its own stop config) without waiting;
        return their ids. A machine busy with another operation is left to it."""
        stopped = []
        for row in self._ex.rows():
            if row.state in _UP and self._ex.current_op(row.id) is None:
                with contextlib.suppress(Conflict):
                    self.stop(StopCommand(app=row.app, machine_id=row.id), source="agent")
                    stopped.append(row.id)
        return stopped

    def running(self) -> bool:
        """Whether any machine still runs or is on its way up or down."""
        return any(r.state in (*_RUNNING, S.STARTING) for r in self._ex.rows())

    async def stop_all(self) -> None:
        """Stop every machine and wait until each has stopped (``stop_machines_on_exit``)."""
        for row in self._ex.rows():
            if row.state in _UP and self._ex.current_op(row.id) is None:
                with contextlib.suppress(Conflict):
                    self.stop(StopCommand(app=row.app, machine_id=row.id), source="agent")
        pending = [op.done for op in self._ex.ops()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def _check_idle(self, row: MachineRow) -> None:
        current = self._ex.current_op(row.id)
        if current is not None:
            raise IllegalTransition(
                f"machine {row.id} is busy: a {current.kind} is in progress",
                hint="wait for it to finish",
            )


def _drain_s(row: MachineRow) -> float:
    """How long a stop leaves the machine out of the proxies' rotation before its signal: its
    ``stop_config.drain_s`` when it has services (a proxy routes to it), else nothing."""
    if not row.config.services or row.state is S.SUSPENDED:
        return 0.0
    return row.config.stop_config.drain_s


def _stop_params(row: MachineRow, signal: str | None, timeout_s: float | None) -> tuple[str, float]:
    sig = _signal_name(signal) if signal else row.config.stop_config.signal
    if timeout_s is not None and not 0 <= timeout_s <= 3600:
        raise InvalidInput("timeout_s must be between 0 and 3600 seconds")
    return sig, timeout_s if timeout_s is not None else row.config.stop_config.timeout_s


def _signal_name(value: str) -> str:
    try:
        return normalise_signal(value)
    except ValueError as exc:
        raise InvalidInput(str(exc), details={"field": "signal"}) from None


def _made(type: EventType, state: MachineState, now: int) -> MachineEvent:
    """An event of a claim's new machine (the user's)."""
    return MachineEvent(type=type, status=state, source="user", timestamp=now)
