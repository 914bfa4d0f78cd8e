"""The broker's use cases over the bus: create (through the market), read, command and follow
machines, and the worker table. Holds no state of record: the workers do.

Every machine command goes to the worker that owns the machine (see :class:`Directory`); the
worker's typed errors (``not_found``, ``illegal_transition``, ``timeout``) reach the caller
unchanged.

While the bus is down (and until the workers are back on it) every use case that needs it fails
at once with 503 ``unavailable`` (:class:`souq.view.outage.BusGuard`); one cut short by the
outage fails the same way, whatever error it would otherwise have ended with (a placement whose
claims all went unanswered is not a lack of capacity).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import nullcontext

from nats.aio.client import Client

from souq.broker.app_store import AppStore
from souq.broker.config import BrokerConfig
from souq.broker.directory import Directory
from souq.broker.idempotency import Coalescer, body_hash
from souq.broker.images import ImageResolver
from souq.broker.key_turns import KeyStore, KeyTurns
from souq.broker.market import Market
from souq.broker.metrics import BrokerMetrics
from souq.broker.networks import AppNetworks
from souq.broker.orders import order as order_of
from souq.broker.orders import placement_of, worker_of_quote
from souq.broker.quotas import Quotas, use_of_config
from souq.broker.region_choice import place_somewhere, with_region
from souq.broker.schemas import CreateMachineRequest, QuoteRequest
from souq.broker.spot_prices import SpotPrices
from souq.broker.streams import StreamSlots
from souq.broker.volume_listing import VolumeListing
from souq.broker.volumes import BrokerVolumes
from souq.broker.worker_calls import WorkerCalls
from souq.bus import Transport, bus_unavailable
from souq.bus.jetstream import OnFirstUse
from souq.clock import Clock, SystemClock
from souq.errors import NotFound, SouqError, Unavailable
from souq.ids import idempotent_request_id, new_request_id
from souq.model import (
    ClaimRequest,
    DestroyCommand,
    ListCommand,
    Machine,
    MachineRef,
    MachineState,
    Placement,
    Quote,
    QuoteRef,
    Resources,
    StopCommand,
    WaitCommand,
    WorkerInfo,
    WorkerState,
)
from souq.model.batch import BatchCreateRequest, BatchResult
from souq.model.machine import MachineConfig, preempted_event
from souq.model.protocol import Lease, LeaseRequest, StartCommand, UpdateCommand
from souq.model.quota import BATCH_MARK
from souq.model.wire import MachineEventNote
from souq.placement import Pipeline
from souq.protocol import WorkerClient
from souq.protocol import verbs as v
from souq.secrets.store import open_bucket
from souq.view import ClusterView, RegionSummary, summarise_regions
from souq.view.liveness import Liveness
from souq.view.outage import BusGuard

__all__ = ["BrokerService"]

log = logging.getLogger(__name__)


class BrokerService:
    def __init__(
        self,
        transport: Transport,
        config: BrokerConfig,
        *,
        clock: Clock | None = None,
        pipeline: Pipeline | None = None,
    ) -> None:
        self.config = config
        self._transport = transport
        self._clock = clock or SystemClock()
        self.client = WorkerClient(transport)
        self.liveness = Liveness(transport, self._clock, down_after_missed=config.down_after_missed)
        self.directory = Directory(self.client)
        self.calls = WorkerCalls(  # a worker by its id, or the worker that holds a machine
            self.client,
            transport,
            self.directory,
            self.liveness,
            config,
            require_bus=self.require_bus,
        )
        self.book = self.liveness.book
        self.market = Market(self.client, self.liveness, config, self._clock, pipeline=pipeline)
        self.images = ImageResolver(self.nats_client)
        # Created apps' records (souq.broker.app_store), and the private network of each app.
        self.app_store = OnFirstUse(lambda: AppStore.open(self.nats_client())).get
        self.networks = AppNetworks(self.app_store, has_store=self._has_nats)
        # The last secrets version this broker wrote: each create asks for at least it, so a
        # secret set just before a create is in the machine (the worker waits to have read it).
        self.secrets_version = 0
        self.spot_prices = SpotPrices(  # souq.broker.spot_prices
            config.spot_price,
            self.liveness.as_heard,
            self._clock,
            self.nats_client if self._has_nats() else None,
        )
        self.streams = StreamSlots(  # event and log streams open (souq.broker.streams)
            per_client=config.streams_per_client, total=config.streams_total
        )
        self._creates: Coalescer[Machine] = Coalescer()
        # An Idempotency-Key's placements take turns across brokers (souq.broker.key_turns).
        self.key_turns = KeyTurns(
            OnFirstUse(lambda: KeyStore.open(self.nats_client())).get if self._has_nats() else None,
            f"broker-{new_request_id()}",
            clock=self._clock,
        )
        self.view = ClusterView(
            transport,
            self.liveness,
            self._clock,
            sync_interval_s=config.view_sync_interval_s,
            request_timeout_s=config.gather_timeout_s,
            events_capacity=config.events_buffer,
            on_machine_event=self._machine_event,
        )
        self.liveness.on_rejoin = self.view.resync_worker  # a worker back from an outage
        self.bus = BusGuard(
            transport, self.liveness, self.view, rejoin_timeout_s=config.gather_timeout_s
        )
        listing = VolumeListing(
            self.client, self.liveness, config.gather_timeout_s, require_bus=self.require_bus
        )
        self.quotas = Quotas(  # souq.broker.quotas
            self.nats_client,
            self._clock,
            deadline_s=config.quota_reservation_s,
            view=self.view,
            live_rows=self.list_rows,
            volumes=listing,
        )
        self.volumes = BrokerVolumes(  # souq.broker.volumes
            self.client,
            config,
            self.market,
            self.calls,
            self.quotas,
            listing,
            require_bus=self.require_bus,
        )
        self.metrics = BrokerMetrics()
        self.metrics.watch(
            self.liveness.workers,
            self.view.status,
            self.view.store.counts_by_state,
            self._clock.now_ms,
        )
        self.metrics.registry.register(self.spot_prices.collector())

    async def start(self) -> None:
        await self.view.start()
        await self.liveness.start()
        self.bus.install()
        await self._make_stores()
        self.quotas.start()
        self.spot_prices.start()

    async def _make_stores(self) -> None:
        """Make the buckets agents read (images, secrets) now: agents only bind to them, so
        that none can make one first with subjects of its choosing (docs/security.md)."""
        try:
            await self.images.store()
            await open_bucket(self.nats_client())
        except SouqError as exc:  # no JetStream (or not NATS): made at their first use, if ever
            log.info("the image and secrets stores are not made yet: %s", exc)

    async def close(self) -> None:
        await self.quotas.close()
        await self.spot_prices.close()
        await self.bus.close()
        await self.view.close()
        await self.liveness.close()

    @property
    def connected(self) -> bool:
        return self._transport.connected

    def nats_server(self) -> str:
        """HOST:PORT of the NATS server this broker is connected to (empty: none, or a bus that
        is not NATS)."""
        client = getattr(self._transport, "client", None)
        url = getattr(client, "connected_url", None)
        return str(url.netloc) if url is not None else ""

    def nats_client(self) -> Client:
        """The NATS connection under the transport, for JetStream (the image store)."""
        client = getattr(self._transport, "client", None)
        if not isinstance(client, Client):
            raise Unavailable("this broker's bus is not NATS: it has no JetStream store")
        return client

    def _has_nats(self) -> bool:
        return isinstance(getattr(self._transport, "client", None), Client)

    def require_bus(self) -> None:
        """Fail at once, 503 ``unavailable``, while the bus is down or the workers rejoin."""
        self.bus.require()

    # -- cluster ---------------------------------------------------------------------------

    async def workers(self) -> list[WorkerInfo]:
        """The worker table, refreshed: each live worker reports its allocation right now."""
        self.require_bus()
        await self.liveness.refresh(timeout=self.config.offer_timeout_s)
        return self.liveness.workers()

    async def regions(self, size: Resources) -> list[RegionSummary]:
        """Every region with its workers and how many machines of ``size`` fit, from the worker
        table, refreshed as for :meth:`workers`."""
        self.require_bus()
        await self.liveness.refresh(timeout=self.config.offer_timeout_s)
        return self.spot_prices.annotate(summarise_regions(self.liveness.as_heard(), size))

    # -- create ----------------------------------------------------------------------------

    async def create_machine(
        self, app: str, body: CreateMachineRequest, *, idempotency_key: str | None = None
    ) -> Machine:
        # A body hash tells a retried key's body from another; a request without a key has a
        # fresh id that nothing can retry, so its id serves (and the hash is not computed).
        request_id = (
            idempotent_request_id(app, idempotency_key) if idempotency_key else new_request_id()
        )
        digest = body_hash(body) if idempotency_key else request_id
        body, region_chosen = with_region(self.liveness, app, body)
        order = order_of(
            app,
            body,
            request_id=request_id,
            digest=digest,
            name=body.name,
            skip_launch=body.skip_launch,
            region_chosen=region_chosen,
        )
        # At least the last secrets version this broker wrote; after the hash, so that a retry
        # of a key is the same request whatever was set meanwhile.
        if self.secrets_version > order.min_secrets_version:
            order = order.model_copy(update={"min_secrets_version": self.secrets_version})

        async def place(made_on: str | None = None) -> Machine:
            nonlocal order
            self.view.hold_launch(request_id)  # released with the answer, or as it fails
            try:
                self.require_bus()
                self.spot_prices.check_bid(order.region, order.config)  # 409 bid_below_price
                order = await self._with_image(order)
                order = order.model_copy(update={"network": await self.networks.of(app)})
                order, volume = await self.volumes.mount_of(order)
                async with self.quotas.counting(app, request_id, order.config) as made:
                    if body.quote is not None:
                        machine = await self._create_with_quote(order, body.quote)
                    else:
                        machine = await place_somewhere(
                            self.market,
                            self.liveness,
                            order,
                            idempotent=idempotency_key is not None,
                            volume=volume,
                            made_on=made_on,
                        )
                    made.append(machine)
            except BaseException as exc:
                self.view.release(request_id)
                if not isinstance(exc, SouqError):
                    raise
                # Cut short by an outage, a placement is unavailable, whatever it ended as.
                err = exc if self.connected else bus_unavailable()
                self.metrics.placed(err.status, placement_of(err))
                if err is exc:
                    raise
                raise err from exc
            self.directory.remember(machine.id, machine.worker_id)
            self.book.placed(machine.id, machine.worker_id, machine.app)
            # After the answer is on its way (the next turn of the loop, still before any
            # later request is read): read-your-writes on this broker, off the create's path.
            asyncio.get_running_loop().call_soon(self._placed, machine, request_id)
            return machine

        if idempotency_key is None:
            return await place()

        async def place_in_turn() -> Machine:
            async with self.key_turns.turn(request_id, digest, idempotency_key) as turn:
                machine = await place(turn.made_on)
                turn.made_on = machine.worker_id
                return machine

        return await self._creates.run(request_id, digest, place_in_turn, key=idempotency_key)

    def _machine_event(self, msg: MachineEventNote) -> None:
        """Every machine event the view decodes: the route to its worker, and the book's count
        of the app's machines there."""
        self.directory.remember(msg.machine_id, msg.worker_id)
        if msg.state is MachineState.DESTROYED:
            self.book.gone(msg.machine_id)
        else:
            self.book.placed(msg.machine_id, msg.worker_id, msg.app)

    def _placed(self, machine: Machine, request_id: str) -> None:
        self.metrics.placed("placed", machine.placement)
        self.view.release(request_id, machine)

    async def create_batch(self, app: str, body: BatchCreateRequest) -> BatchResult:
        """``count`` machines of one config in one placement (see :mod:`souq.broker.market`)."""
        self.require_bus()
        self.volumes.refuse_mounts(body.config, "a batch")
        self.spot_prices.check_bid(body.region, body.config)
        image = await self.images.of_config(body.config, app)
        request_id = new_request_id()
        try:
            async with self.quotas.counting(app, request_id, body.config, count=body.count) as made:
                result = await self.market.place_batch(
                    app,
                    body,
                    request_id=request_id + BATCH_MARK,
                    body_hash=body_hash(body),
                    image=image,
                    network=await self.networks.of(app),
                )
                made.extend(result.machines)
        except SouqError as exc:
            if not self.connected:
                raise bus_unavailable() from exc
            raise
        for machine in result.machines:
            self.directory.remember(machine.id, machine.worker_id)
            self.book.placed(machine.id, machine.worker_id, machine.app)
            self.view.apply(machine)
        return result

    async def _with_image(self, order: ClaimRequest) -> ClaimRequest:
        """``order`` with the image its config names, resolved (``image_not_found`` before any
        capacity is claimed)."""
        image = await self.images.of_config(order.config, order.app)
        return order if image is None else order.model_copy(update={"image": image})

    async def _create_with_quote(self, order: ClaimRequest, quote_id: str) -> Machine:
        """Claim exactly the quote's hold on the worker that holds it; the machine keeps the
        quote's placement record."""
        worker_id = worker_of_quote(quote_id)
        claim = order.model_copy(update={"quote_id": quote_id})
        return self._seen(
            await self.calls.worker(worker_id, v.CLAIM, claim, what=f"quote {quote_id}")
        )

    async def explain(self, app: str, body: CreateMachineRequest) -> Placement:
        """A dry run of a create: the placement record, nothing claimed."""
        self.require_bus()
        if body.quote is not None:
            quote = await self.get_quote(app, body.quote)
            if quote.placement is None:
                raise NotFound(f"quote {body.quote} has no placement record")
            return quote.placement
        placed, region_chosen = with_region(self.liveness, app, body)
        self.spot_prices.check_bid(placed.region or "", placed.config)
        order = order_of(app, placed, name=body.name, region_chosen=region_chosen)
        order, volume = await self.volumes.mount_of(await self._with_image(order))
        return await self.market.explain(order, volume=volume)

    # -- quotes ----------------------------------------------------------------------------

    async def create_quote(self, app: str, body: QuoteRequest) -> Quote:
        """Hold capacity on the best worker for ``body.ttl_s``: a dry run that binds."""
        self.require_bus()
        self.volumes.refuse_mounts(body.config, "a quote")
        self.spot_prices.check_bid(body.region, body.config)
        return await self.market.hold(await self._with_image(order_of(app, body)), ttl_s=body.ttl_s)

    async def get_quote(self, app: str, quote_id: str) -> Quote:
        ref = QuoteRef(app=app, quote_id=quote_id)
        return await self.calls.worker(
            worker_of_quote(quote_id), v.QUOTE, ref, what=f"quote {quote_id}"
        )

    async def release_quote(self, app: str, quote_id: str) -> Quote:
        ref = QuoteRef(app=app, quote_id=quote_id)
        worker_id = worker_of_quote(quote_id)
        return await self.calls.worker(worker_id, v.RELEASE, ref, what=f"quote {quote_id}")

    # -- read ------------------------------------------------------------------------------

    async def list_machines(self, app: str) -> list[Machine]:
        """Every worker's machines of ``app`` (not destroyed), oldest first."""
        return [Machine.model_validate_json(body) for _, body in await self.list_rows(app)]

    async def list_rows(self, app: str, *, destroyed: bool = False) -> list[tuple[str, str]]:
        """``(worker_id, machine JSON)`` of the app's machines, oldest first: from the cluster
        view once it is complete, else by asking every live worker (see docs/view.md).
        Unavailable while the bus is down: the view cannot be trusted then."""
        self.require_bus()
        if self.view.complete or destroyed:  # the destroyed: only the view keeps them
            return self.view.store.app_rows(app, destroyed=destroyed)
        gathered = await self._gather_machines(app)
        # A worker that cannot answer (down: crashed, or cut off) still has its machines: the
        # view's last copies stand for them, as in a list from a complete view.
        live = {wid for wid, _, state in self.liveness.states() if state is not WorkerState.DOWN}
        have = {m.id for m in gathered}
        kept = self.view.store.app_rows(app)
        silent = [Machine.model_validate_json(body) for w, body in kept if w not in live]
        silent = [m for m in silent if m.id not in have]
        machines = sorted([*gathered, *silent], key=lambda m: (m.created_at, m.id))
        return [(m.worker_id, m.model_dump_json()) for m in machines]

    async def _gather_machines(self, app: str) -> list[Machine]:
        replies = await self.client.ask_all(
            v.LIST,
            ListCommand(app=app),
            expect=self.liveness.live_count() or None,
            timeout=self.config.gather_timeout_s,
        )
        machines: dict[str, Machine] = {}
        for batch in replies:
            for machine in batch:
                self.directory.remember(machine.id, machine.worker_id)
                self.view.apply(machine)
                machines[machine.id] = machine
        return sorted(machines.values(), key=lambda m: (m.created_at, m.id))

    def cached_machine(self, app: str, machine_id: str) -> Machine | None:
        """The view's copy of a machine (``?stale=true``), or None if the view has none."""
        body = self.view.store.machine_json(machine_id)
        if body is None:
            return None
        machine = Machine.model_validate_json(body)
        return machine if machine.app == app else None

    async def get_machine(self, app: str, machine_id: str) -> Machine:
        ref = MachineRef(app=app, machine_id=machine_id)
        return self._seen(await self.calls.owner(machine_id, v.GET, ref))

    # -- commands --------------------------------------------------------------------------

    # ``nonce``: the machine's lease's, when it is leased (``lease_held`` without it).

    async def start_machine(
        self, app: str, machine_id: str, *, nonce: str | None = None
    ) -> Machine:
        """A machine that preemption displaced takes room again when it starts: its app's
        quota counts it first (its record read fresh then: :meth:`Quotas.regaining`)."""
        ref = StartCommand(app=app, machine_id=machine_id, lease_nonce=nonce)
        counted = self.quotas.may_count(app)
        known = await self.get_machine(app, machine_id) if counted else None
        known = known or self.cached_machine(app, machine_id)
        if known is not None and known.state is not MachineState.STARTED:
            self.spot_prices.check_bid(known.region, known.config)  # 409 bid_below_price
        regaining = self.quotas.regaining(app, known) if counted and known else nullcontext()
        async with regaining:  # 403 past its quota: it stays stopped
            return self._seen(await self.calls.owner(machine_id, v.START, ref))

    async def stop_machine(self, cmd: StopCommand) -> Machine:
        """Returns once the signal is sent (the machine is ``stopping``); see :meth:`wait`."""
        return self._seen(await self.calls.owner(cmd.machine_id, v.STOP, cmd))

    async def restart_machine(self, cmd: StopCommand) -> Machine:
        """Returns once the machine has stopped and started again: allowed its stop's grace and
        a command's time for each half (a start may mount and grow its volumes first)."""
        grace = cmd.timeout_s
        grace = await self._stop_timeout(cmd.app, cmd.machine_id) if grace is None else grace
        extra_s = grace + self.config.command_timeout_s
        return self._seen(await self.calls.owner(cmd.machine_id, v.RESTART, cmd, extra_s=extra_s))

    async def update_machine(
        self,
        app: str,
        machine_id: str,
        config: MachineConfig,
        *,
        skip_launch: bool = False,
        skip_secrets: bool = False,
        min_secrets_version: int = 0,
        nonce: str | None = None,
    ) -> Machine:
        """Replace a machine's config on its worker (its image resolved first, as at a
        create); answers once it has restarted with it (or at once with ``skip_launch``).
        ``skip_secrets``: from now on it starts without its app's secrets;
        ``min_secrets_version``: with them as of that version or later."""
        self.require_bus()
        image = await self.images.of_config(config, app)
        config = await self.volumes.named_for(app, machine_id, config)
        current = await self.get_machine(app, machine_id)
        grace = current.config.stop_config.timeout_s
        cmd = UpdateCommand(
            app=app,
            machine_id=machine_id,
            config=config,
            image=image,
            skip_launch=skip_launch,
            skip_secrets=skip_secrets,
            min_secrets_version=min_secrets_version,
            lease_nonce=nonce,
        )
        # A machine preemption displaced takes room again if the update launches it.
        displaced = not skip_launch and preempted_event(current) is not None
        growing = self.quotas.growing(app, machine_id, current.config, config, displaced=displaced)
        async with growing:  # 403 past it
            updated = await self.calls.owner(machine_id, v.UPDATE, cmd, extra_s=grace + 60)
        updated = self._seen(updated)
        before, after = use_of_config(current.config), use_of_config(config)
        if after.cpus < before.cpus or after.memory_mb < before.memory_mb:
            await self.quotas.resized(app, machine_id, config)  # a shrink counts once done
        return updated

    async def destroy_machine(
        self,
        app: str,
        machine_id: str,
        *,
        force: bool = False,
        graceful: bool = False,
        nonce: str | None = None,
    ) -> Machine:
        """Returns once the machine is ``destroyed`` (``graceful``: once it is ``destroying``,
        out of rotation, its stop and destruction under way on its worker)."""
        grace = 0.0 if force or graceful else await self._stop_timeout(app, machine_id)
        cmd = DestroyCommand(
            app=app, machine_id=machine_id, force=force, graceful=graceful, lease_nonce=nonce
        )
        destroyed = self._seen(await self.calls.owner(machine_id, v.DESTROY, cmd, extra_s=grace))
        await self.quotas.release(app, [machine_id])  # its quota given back
        return destroyed

    # -- leases ----------------------------------------------------------------------------

    async def take_lease(self, req: LeaseRequest) -> Lease:
        """Lease the machine (or extend the lease whose nonce ``req`` brings)."""
        return await self.calls.owner(req.machine_id, v.LEASE, req)

    async def lease(self, app: str, machine_id: str) -> Lease:
        return await self.calls.owner(
            machine_id, v.LEASE_GET, MachineRef(app=app, machine_id=machine_id)
        )

    async def release_lease(self, app: str, machine_id: str, nonce: str | None) -> Lease:
        ref = MachineRef(app=app, machine_id=machine_id, lease_nonce=nonce)
        return await self.calls.owner(machine_id, v.LEASE_RELEASE, ref)

    async def wait(self, cmd: WaitCommand) -> Machine:
        """The machine once it reaches ``cmd.state`` or one of ``cmd.states`` (at
        ``instance_id`` when given; its checks passing, with ``healthy``);
        :class:`WaitTimeout` after ``timeout_s``."""
        return self._seen(
            await self.calls.owner(cmd.machine_id, v.WAIT, cmd, extra_s=cmd.timeout_s)
        )

    # -- routing ---------------------------------------------------------------------------

    def _seen(self, machine: Machine) -> Machine:
        """A machine record straight from its worker: this broker's view takes it at once."""
        self.view.apply(machine)
        return machine

    async def _stop_timeout(self, app: str, machine_id: str) -> float:
        machine = await self.get_machine(app, machine_id)
        return machine.config.stop_config.timeout_s
