"""The agent's answer to each verb of the protocol (:mod:`souq.protocol.verbs`).

:meth:`WorkerVerbs.dispatcher` is the table the bus shell (:mod:`souq.agent.service`) and the hollow
fleet hand every request to. Each handler takes the verb's typed request and returns its typed
reply; the rules of who may claim what live in :mod:`souq.agent.capacity.admission`, the machine
commands in :mod:`souq.agent.machines.commands`.
"""

from __future__ import annotations

import asyncio
import logging

from souq.agent.capacity.load import LoadGauge
from souq.agent.machines import evictions
from souq.agent.machines.batch import claim_batch
from souq.agent.machines.commands import Commands
from souq.agent.machines.executor import Executor
from souq.agent.machines.quotes import Quotes
from souq.agent.machines.tools import MachineTools
from souq.agent.publisher import Publisher
from souq.agent.state.records import MachineRow
from souq.agent.stats import AgentStats
from souq.agent.volumes.verbs import route_volumes
from souq.agent.wire import machine_json
from souq.bus.codec import Encoded
from souq.clock import Clock, iso_from_ms
from souq.errors import ClaimRefused, Conflict, IllegalTransition, NotFound, Unavailable
from souq.model import protocol as msg
from souq.model.batch import BatchClaimReply, BatchClaimRequest
from souq.model.machine import Machine, MachineEvent, MachineState, OpRecord, preempted_event
from souq.model.machine_tools import MachineCordonCommand, MetadataCommand
from souq.model.reasons import Reason
from souq.model.resources import Resources
from souq.model.worker import Fingerprint, WorkerInfo, WorkerState, WorkerUsage
from souq.protocol import verbs as v
from souq.protocol.dispatch import Dispatcher
from souq.view.digest import machines_digest

__all__ = ["WorkerVerbs"]

log = logging.getLogger(__name__)


class WorkerVerbs:
    """The worker's handlers, and what they share: its identity, capacity and flags."""

    def __init__(
        self,
        executor: Executor,
        commands: Commands,
        *,
        labels: dict[str, str],
        fingerprint: Fingerprint,
        clock: Clock,
        stats: AgentStats,
        load: LoadGauge | None = None,
    ) -> None:
        """``load``: the host's load gauge, shared by every worker on the host (the hollow
        fleet); by default the worker measures its own."""
        self._ex = executor
        self._cmd = commands
        self.worker_id = executor.worker_id
        self.region = executor.region
        self.admission = executor.admission
        self.labels = dict(labels)
        self.fingerprint = fingerprint
        self._clock = clock
        self.stats = stats
        self.quotes = Quotes(executor.store, clock, self.admission, on_change=self._announce)
        self.publisher: Publisher | None = None  # set by the shell once it is on the bus
        self._load = load or LoadGauge(clock)
        self.tools = MachineTools(executor, clock)
        self._room = evictions.Room(executor)  # what lower classes could free, as told
        # Claims, batch claims and holds take turns, one per turn of the event loop: a burst of
        # hundreds (each one a transaction and a spawn) would otherwise run back to back in one
        # turn, and the heartbeats, offers and answers due meanwhile would wait for all of them
        # (a broker that hears nothing from a worker for that long takes it for dead).
        self._claims = asyncio.Lock()

    def dispatcher(self) -> Dispatcher:
        d = Dispatcher(f"worker {self.worker_id}", ledger=lambda: self.admission.version)
        d.route(v.OFFER, self._offer)
        d.route(v.CLAIM, self._claim)
        d.route(v.CLAIM_BATCH, self._claim_batch)
        d.route(v.GET, self._get)
        d.route(v.START, self._start)
        d.route(v.SUSPEND, self._suspend)
        d.route(v.STOP, self._stop)
        d.route(v.RESTART, self._restart)
        d.route(v.SIGNAL, self._signal)
        d.route(v.UPDATE, self._update)
        d.route(v.LEASE, self._lease)
        d.route(v.LEASE_GET, self._lease_get)
        d.route(v.LEASE_RELEASE, self._lease_release)
        d.route(v.DESTROY, self._destroy)
        d.route(v.WAIT, self._cmd.wait)
        d.route(v.LOGS, self._logs)
        d.route(v.EVENTS, self._events)
        d.route(v.OPS, self._ops)
        d.route(v.HOLD, self._hold)
        d.route(v.QUOTE, self._quote)
        d.route(v.RELEASE, self._release)
        d.route(v.CORDON, self._cordon)
        d.route(v.DRAIN, self._drain)
        d.route(v.LIST, self._list)
        d.route(v.DIGEST, self._digest)
        d.route(v.LOCATE, self._locate)
        for name, handler in self.tools.answers().items():
            d.route(v.VERBS[name], handler)
        d.route(v.METADATA, self._metadata)
        d.route(v.MACHINE_CORDON, self._machine_cordon)
        if self._ex.volumes is not None:
            route_volumes(d, self._ex.volumes, self._announce)
        return d

    # -- the worker as others see it -------------------------------------------------------

    @property
    def capacity(self) -> Resources:
        return self.admission.capacity

    def worker_info(self, *, room: bool = True) -> WorkerInfo:
        """The worker as a heartbeat tells it; ``room=False``: without what lower classes could
        free (an offer's: a preempting create's offer says whom it would displace instead)."""
        now = self._clock.now_ms()
        return WorkerInfo(
            id=self.worker_id,
            region=self.region,
            state=self.state(),
            capacity=self.admission.capacity,
            allocated=self.admission.in_use(now),
            labels=self.labels,
            fingerprint=self.fingerprint,
            machines=self._ex.machine_count(),
            last_seen=now,
            version=self.admission.version,
            load=self._load.read(),
            images=self.images(),
            gpu_free=list(self.admission.gpu_free(now)),
            gpu_shapes=self.admission.gpu_shapes(),
            preemptible=self._room.now() if room else None,
        )

    def usage(self) -> WorkerUsage:
        """What the worker has promised now (sent whenever it changes)."""
        return self.admission.usage(
            self._clock.now_ms(),
            state=self.state(),
            machines=self._ex.machine_count(),
            preemptible=self._room.now(),
        )

    def images(self) -> list[str]:
        """The images cached here, most recently used first."""
        return [] if self._ex.images is None else self._ex.images.images()

    def layers(self) -> list[str]:
        """The image layers held here, by short digest (heartbeats carry them)."""
        return [] if self._ex.images is None else self._ex.images.layers()

    def state(self) -> WorkerState:
        if self.admission.draining and self._cmd.running():
            return WorkerState.DRAINING
        return WorkerState.CORDONED if self.admission.cordoned else WorkerState.UP

    def _announce(self) -> None:
        if self.publisher is not None:
            self.publisher.announce()

    async def _heartbeat(self) -> None:
        if self.publisher is not None:
            await self.publisher.heartbeat()

    def offer(self, req: msg.OfferRequest) -> msg.Offer:
        info = self.worker_info(room=False)
        existing = self._ex.machine_for_request(req.request_id)
        if existing is not None:
            return msg.Offer(worker=info, eligible=True, existing_machine_id=existing)
        refusal = self.admission.offer_refusal(req.resources, self._clock.now_ms())
        if refusal is not None and refusal[0] is Reason.CORDONED:
            return msg.Offer(worker=info, eligible=False, reason=refusal[0], detail=refusal[1])
        eviction = None
        if refusal is not None and req.priority_class is not None and req.max_victims:
            eviction = self._eviction_offer(req, req.priority_class)
            if eviction is not None:
                refusal = None
            else:
                refusal = (refusal[0], f"{refusal[1]}, and displacing machines would not do")
        # What placement scores beyond capacity: the host's measured load (cached, refreshed
        # at most every 0.5 s), how much of the image it holds, and the app's machines here.
        held = pull = None
        if self._ex.images is not None:
            held, pull = self._ex.images.terms(req.image, req.image_layers)
        elif req.image is not None:
            held, pull = 0, sum(req.image_layers.values())
        return msg.Offer(
            worker=info,
            eligible=refusal is None,
            reason=refusal[0] if refusal else None,
            detail=refusal[1] if refusal else None,
            load=info.load,
            image_layers=held,
            image_bytes=pull,
            app_machines=self._ex.machine_count(req.app),
            eviction=eviction,
        )

    def _eviction_offer(self, req: msg.OfferRequest, claimant: str) -> msg.OfferedEviction | None:
        """Whom this worker would displace to take the machine (None: nobody would do)."""
        plan = self.admission.plan_preemption(
            req.resources,
            self._clock.now_ms(),
            claimant=claimant,
            max_victims=req.max_victims,
            candidates=evictions.candidates(self._ex, claimant),
        )
        if plan is None:
            return None
        return plan.offered()

    # -- placement -------------------------------------------------------------------------

    async def _offer(self, req: msg.OfferRequest) -> msg.Offer:
        self.stats.offers += 1
        return self.offer(req)

    async def _claim(self, req: msg.ClaimRequest) -> Encoded:
        """The machine, encoded with the config JSON the store made of it. A new machine's
        reply leaves out the placement record the claim brought (the caller has it, and it is
        most of the reply's bytes); a machine made before (a retry) or through a quote keeps
        the record it was made with."""
        await self._secrets_read(req)
        async with self._claims:
            new = req.placement is not None and self._ex.machine_for_request(req.request_id) is None
            machine = self._claim_machine(req)
        json_of = self._ex.store.json_of
        # A machine of an image keeps its record in the reply: the worker said what it had; so
        # does one that displaced machines (whom).
        preempted = machine.placement is not None and bool(machine.placement.preempted)
        keep = not new or req.image is not None or preempted
        return Encoded(machine_json(machine, json_of, placement=keep))

    async def _secrets_read(
        self, req: msg.ClaimRequest | BatchClaimRequest | msg.UpdateCommand
    ) -> None:
        """Wait (briefly) for this worker to have read the app's secrets as far as the claim
        asks (its ``min_secrets_version``); Unavailable if it has not."""
        secrets, version = self._ex.secrets, req.min_secrets_version
        if not version or req.skip_secrets or secrets is None:
            return
        if not await secrets.caught_up(version):
            raise Unavailable(
                f"worker {self._ex.worker_id} has not read the app secrets as of version "
                f"{version} yet",
                hint="try again in a moment: the worker reads them from NATS (JetStream)",
            )

    def _claim_machine(self, req: msg.ClaimRequest) -> Machine:
        try:
            quote = None
            if req.quote_id is not None:
                quote = self.quotes.held_quote(req.app, req.quote_id)
                if req.placement is None:
                    # The machine keeps the explanation of the placement its quote made.
                    placement = self.quotes.placement(req.quote_id)
                    req = req.model_copy(update={"placement": placement})
            machine = self._cmd.claim(req, quote=quote)
        except ClaimRefused as exc:
            self.stats.claimed(str(exc.details.get("reason", exc.status)))
            if req.preempt and "usage" in exc.details:
                # The broker's book corrects itself from it: what lower classes could free too.
                exc.details["usage"] = self.usage().model_dump(mode="json")
            raise
        self.stats.claimed("accepted")
        if req.quote_id is not None:
            self.quotes.used(req.quote_id)
        return machine

    async def _claim_batch(self, req: BatchClaimRequest) -> BatchClaimReply:
        await self._secrets_read(req)
        async with self._claims:
            return claim_batch(self._ex, self._cmd, req, now_ms=self._clock.now_ms())

    async def _hold(self, req: msg.HoldRequest) -> msg.Quote:
        async with self._claims:
            return self.quotes.hold(req)

    async def _quote(self, ref: msg.QuoteRef) -> msg.Quote:
        return self.quotes.get(ref.app, ref.quote_id)

    async def _release(self, ref: msg.QuoteRef) -> msg.Quote:
        return self.quotes.release(ref.app, ref.quote_id)

    # -- the worker ------------------------------------------------------------------------

    async def _cordon(self, cmd: msg.CordonCommand) -> WorkerInfo:
        """Cordon or uncordon: a cordoned worker makes no offers and refuses new claims; its
        machines keep running. Kept across agent restarts."""
        a = self.admission
        if cmd.cordoned != a.cordoned or (a.draining and not cmd.cordoned):
            draining = a.draining and cmd.cordoned
            self._ex.store.set_flags(cordoned=cmd.cordoned, draining=draining)
            a.set_flags(cordoned=cmd.cordoned, draining=draining)
            await self._heartbeat()
        return self.worker_info()

    async def _drain(self, cmd: msg.DrainCommand) -> WorkerInfo:
        """Cordon the worker and stop its machines gracefully, each with its own stop config.
        Answers at once; the worker reports ``draining`` until none runs, then ``cordoned``.
        ``uncordon`` ends a drain (stopped machines stay stopped)."""
        if not (self.admission.cordoned and self.admission.draining):
            self._ex.store.set_flags(cordoned=True, draining=True)
            self.admission.set_flags(cordoned=True, draining=True)
        stopped = self._cmd.stop_every()
        log.info("draining worker %s: stopping %d machines", self.worker_id, len(stopped))
        await self._heartbeat()
        return self.worker_info()

    async def _list(self, cmd: msg.ListCommand) -> list[Machine]:
        return self._ex.list_machines(cmd.app, include_destroyed=cmd.include_destroyed)

    async def _digest(self, cmd: msg.DigestCommand) -> msg.WorkerDigest:
        rows = [r for r in self._ex.rows() if r.state is not MachineState.DESTROYED]
        return msg.WorkerDigest(
            worker_id=self.worker_id,
            machines=len(rows),
            digest=machines_digest((r.id, r.state.value, iso_from_ms(r.updated_at)) for r in rows),
        )

    async def _locate(self, cmd: msg.LocateCommand) -> msg.LocateReply:
        return msg.LocateReply(worker_id=self.worker_id, found=self._ex.has(cmd.machine_id))

    # -- machines --------------------------------------------------------------------------

    async def _get(self, ref: msg.MachineRef) -> Machine:
        return self._ex.machine(ref.app, ref.machine_id)

    # Every change of a machine checks its lease first (:mod:`souq.agent.machines.leases`).

    def _leased(self, ref: msg.MachineRef) -> None:
        self._ex.row(ref.app, ref.machine_id)  # another app's machine is not found
        self._cmd.leases.check(ref.machine_id, ref.lease_nonce)

    async def _start(self, ref: msg.StartCommand) -> Machine:
        if ref.wake:  # the proxy's, for traffic: a lease never takes the app offline
            self._displaced(self._ex.row(ref.app, ref.machine_id))
        else:
            self._leased(ref)
        return self._cmd.start(ref.app, ref.machine_id)

    def _displaced(self, row: MachineRow) -> None:
        """Refuse the proxy's start of a machine that preemption displaced (it holds no room):
        its start takes room again, which its app's quota counts first, and only a broker's
        start (the API's) asks the quota."""
        if row.id in self._ex.unreserved:
            machine = self._ex.machine(row.app, row.id)
            if preempted_event(machine) is not None:
                raise Conflict(
                    f"machine {row.id} was displaced by preemption: starting it takes its room "
                    "again, which its app's quota counts first; the proxy does not wake it",
                    hint=f"start it through the API (POST /v1/apps/{row.app}/machines/{row.id}"
                    "/start, `souq machine start`)",
                )

    async def _suspend(self, ref: msg.MachineRef) -> Machine:
        self._leased(ref)
        return self._cmd.suspend(ref.app, ref.machine_id)

    async def _stop(self, cmd: msg.StopCommand) -> Machine:
        self._leased(cmd)
        return self._cmd.stop(cmd)

    async def _restart(self, cmd: msg.StopCommand) -> Machine:
        self._leased(cmd)
        return await self._cmd.restart(cmd)

    async def _update(self, cmd: msg.UpdateCommand) -> Machine:
        self._leased(cmd)
        await self._secrets_read(cmd)
        return await self._cmd.update(cmd)

    async def _signal(self, cmd: msg.SignalCommand) -> Machine:
        self._leased(cmd)
        return self._cmd.signal(cmd.app, cmd.machine_id, cmd.signal)

    async def _destroy(self, cmd: msg.DestroyCommand) -> Machine:
        self._leased(cmd)
        return await self._cmd.destroy(
            cmd.app, cmd.machine_id, force=cmd.force, graceful=cmd.graceful
        )

    async def _metadata(self, cmd: MetadataCommand) -> dict[str, str]:
        return self.tools.metadata(cmd)  # Fly's SetMetadata sends no lease nonce

    async def _machine_cordon(self, cmd: MachineCordonCommand) -> Machine:
        self._leased(cmd)
        return self.tools.cordon(cmd)

    async def _lease(self, req: msg.LeaseRequest) -> msg.Lease:
        row = self._ex.row(req.app, req.machine_id)
        if row.state is MachineState.DESTROYED:
            raise IllegalTransition(f"machine {row.id} is destroyed", hint="lease a live machine")
        return self._cmd.leases.take(row.id, req.ttl_s, req.description, req.lease_nonce)

    async def _lease_get(self, ref: msg.MachineRef) -> msg.Lease:
        self._ex.row(ref.app, ref.machine_id)
        lease = self._cmd.leases.live(ref.machine_id)
        if lease is None:
            raise NotFound(f"machine {ref.machine_id} has no lease", hint="take one with POST")
        return lease

    async def _lease_release(self, ref: msg.MachineRef) -> msg.Lease:
        self._ex.row(ref.app, ref.machine_id)
        return self._cmd.leases.release(ref.machine_id, ref.lease_nonce)

    async def _logs(self, cmd: msg.LogsCommand) -> msg.LogsReply:
        return await self._cmd.logs(
            cmd.app,
            cmd.machine_id,
            offset=cmd.offset,
            max_bytes=cmd.max_bytes,
            wait_s=cmd.wait_s,
        )

    async def _ops(self, ref: msg.MachineRef) -> list[OpRecord]:
        return self._cmd.ops(ref.app, ref.machine_id)

    async def _events(self, cmd: msg.EventsCommand) -> list[MachineEvent]:
        return self._cmd.events(cmd.app, cmd.machine_id)
