"""The market's shell: drives the pure placement core (:mod:`souq.market`) over the bus.

An :class:`~souq.market.Auction` decides; this module only performs what it asks for — offers
asked of the workers (:meth:`WorkerClient.ask_region`, :meth:`WorkerClient.call_each`), claims
sent (``claim``, ``claim_batch`` or ``hold``, several at once for a batch) — and feeds the
answers back, until the auction finishes. Immediate-or-cancel: the machines are made within the
call, or it raises :class:`InsufficientCapacity` carrying the placement record that explains why.

* :meth:`Market.place` — one machine (``claim``);
* :meth:`Market.place_batch` — ``count`` machines of one config in one call, one ``claim_batch``
  per chosen worker; fewer than ``min_count`` placed and the ones made are destroyed again;
* :meth:`Market.hold` — a quote: the best worker holds the capacity for a while (``hold``);
* :meth:`Market.explain` — a dry run: the ranking, nothing claimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from souq.broker.claims import Claims
from souq.broker.config import BrokerConfig
from souq.clock import Clock
from souq.errors import (
    ClaimRefused,
    InsufficientCapacity,
    InvalidInput,
    NoReply,
    SouqError,
    Unavailable,
    UnknownRegion,
)
from souq.ids import new_quote_id
from souq.market import AskOffers, Auction, Finished, Order, Purpose, Rules, SendClaim, WorkerBook
from souq.model import (
    ClaimRequest,
    DestroyCommand,
    HoldRequest,
    Machine,
    Offer,
    OfferRequest,
    Placement,
    Quote,
    Timings,
    WorkerState,
    WorkerUsage,
)
from souq.model.batch import (
    BatchClaimRequest,
    BatchCreateRequest,
    BatchResult,
    machines_per_claim,
)
from souq.model.choices import PriorityClass
from souq.model.image import ImageRecord
from souq.model.reasons import Reason
from souq.placement import Pipeline, PipelineCache, PlacementRequest
from souq.protocol import WorkerClient
from souq.protocol.verbs import CLAIM, CLAIM_BATCH, DESTROY, HOLD, OFFER
from souq.view.liveness import Liveness

__all__ = ["Market"]

log = logging.getLogger(__name__)

CLAIM_S_PER_MACHINE = 0.01  # a batch claim's deadline grows by this per machine it carries
DEFAULT_MAX_PAYLOAD = 1024 * 1024  # NATS's default, for a bus that does not say (in memory)

# A claim's answers (one per machine) and the worker's ledger version once it was done.
Answer = tuple[list[Any], int | None]
Claimer = Callable[[SendClaim], Coroutine[Any, Any, Answer]]


class Market:
    def __init__(
        self,
        workers: WorkerClient,
        liveness: Liveness,
        config: BrokerConfig,
        clock: Clock,
        *,
        book: WorkerBook | None = None,
        pipeline: Pipeline | None = None,
    ) -> None:
        self._workers = workers
        self._liveness = liveness
        self._config = config
        self._claims = Claims(workers, liveness, config, clock)  # souq.broker.claims
        self._claim_call = self._claims.send
        self._clock = clock
        self.book = book if book is not None else liveness.book
        # Pipelines by placement policy (a create's, over the broker's default); ``pipeline``
        # replaces the default one (tests).
        self._pipelines = PipelineCache(config.placement)
        self._pipeline = pipeline or self._pipelines.default
        self._rules = Rules(
            use_book=config.candidates_from == "book",
            candidates=config.sample_min,
            factor_d=config.sample_factor_d,
            sample_above=config.sample_above,
            sample_min=config.sample_min,
            max_silent=config.max_claim_attempts,
            max_rounds=config.max_claim_attempts,
        )
        self._turns = asyncio.Semaphore(config.batch_concurrency)

    # -- one machine -----------------------------------------------------------------------

    async def place(
        self,
        order: ClaimRequest,
        *,
        idempotent: bool = False,
        volume: tuple[str, str] | None = None,
        made_on: str | None = None,
    ) -> Machine:
        """Place ``order`` (a claim without its placement record yet) and return the machine.
        ``idempotent``: the request id may have made a machine already; find it first.
        ``volume``: the volume it mounts and the worker holding it (only that one will do).
        ``made_on``: the worker that made the request's machine, as an earlier placement of it
        said (:mod:`souq.broker.key_turns`): claimed there first, which answers with it."""
        if made_on is not None:
            found = await self._claims.where_made(order, made_on)
            if found is not None:
                return found

        async def claim(action: SendClaim) -> Answer:
            body = (
                order
                if action.existing
                else order.model_copy(
                    update={"placement": _noted(action.record, order), "preempt": action.preempt}
                )
            )
            machine, ledger = await self._claim_call(action.worker_id, CLAIM, body)
            return [machine], ledger

        auction = self._auction(order, Purpose.CLAIM, find_existing=idempotent, volume=volume)
        done = self._outcome(auction, await self._run(auction, claim))
        machine: Machine = done.placed[0]
        if auction.existing is None:  # an earlier machine keeps the record it was made with
            record: Placement = _noted(done.record, order)
            told = machine.placement  # a machine of an image: what the worker had of it
            if told is not None and told.image is not None:
                record = record.model_copy(update={"cached": told.cached, "image": told.image})
            if told is not None and told.preempted:  # whom the worker displaced for it
                record = record.model_copy(update={"preempted": told.preempted})
            machine = machine.model_copy(update={"placement": record})
        return machine

    async def explain(
        self, order: ClaimRequest, *, volume: tuple[str, str] | None = None
    ) -> Placement:
        """A dry run: the placement record of ``order`` as if placed now, claiming nothing.
        Raises :class:`InsufficientCapacity` (with the record) when nothing would fit."""

        async def nothing(action: SendClaim) -> Answer:
            raise AssertionError("a dry run claims nothing")  # pragma: no cover

        auction = self._auction(order, Purpose.EXPLAIN, volume=volume)
        done = self._outcome(auction, await self._run(auction, nothing))
        return _noted(done.record, order)

    async def hold(self, order: ClaimRequest, *, ttl_s: float) -> Quote:
        """A dry run that binds: hold capacity for ``order`` on the best worker for ``ttl_s``."""

        async def hold(action: SendClaim) -> Answer:
            body = HoldRequest(
                quote_id=new_quote_id(action.worker_id),
                app=order.app,
                region=order.region,
                config=order.config,
                ttl_s=ttl_s,
                placement=action.record,
            )
            quote, ledger = await self._claim_call(action.worker_id, HOLD, body)
            return [quote], ledger

        auction = self._auction(order, Purpose.HOLD)
        done = self._outcome(auction, await self._run(auction, hold))
        quote: Quote = done.placed[0]
        return quote.model_copy(update={"placement": done.record})

    async def place_volume(
        self, request: PlacementRequest, claim: Callable[[str], Coroutine[Any, Any, Any]]
    ) -> tuple[Any, Placement]:
        """Place a volume (``request``: its size as disk): rank the region's workers as for a
        machine, then ``claim(worker_id)`` down the ranking until one makes it. Returns what
        that claim answered and the placement record."""

        async def send(action: SendClaim) -> Answer:
            return [await claim(action.worker_id)], None

        auction = self._new_auction(Order(request, purpose=Purpose.CLAIM), self._pipeline)
        done = self._outcome(auction, await self._run(auction, send))
        record: Placement = done.record
        return done.placed[0], record

    # -- a batch ---------------------------------------------------------------------------

    async def place_batch(
        self,
        app: str,
        body: BatchCreateRequest,
        *,
        request_id: str,
        body_hash: str,
        image: ImageRecord | None = None,
        network: str = "",
    ) -> BatchResult:
        """``count`` machines of one config in one placement. At most ``batch_concurrency``
        batches run at once on this broker; the others wait their turn (at most
        ``batch_admission_timeout_s``, then 503)."""
        count = body.count
        min_count = body.min_count if body.min_count is not None else count
        if count > self._config.max_batch:
            raise InvalidInput(
                f"count: at most {self._config.max_batch} machines per batch",
                details={"field": "count"},
            )
        if min_count > count:
            raise InvalidInput("min_count: cannot exceed count", details={"field": "min_count"})
        try:
            async with asyncio.timeout(self._config.batch_admission_timeout_s):
                await self._turns.acquire()
        except TimeoutError:
            raise Unavailable(
                f"the broker is busy placing other batches (at most "
                f"{self._config.batch_concurrency} at once); nothing was placed",
                hint="retry shortly, or spread batches over several brokers",
            ) from None
        try:
            return await self._place_batch(
                app, body, request_id, body_hash, min_count, image=image, network=network
            )
        finally:
            self._turns.release()

    async def _place_batch(
        self,
        app: str,
        body: BatchCreateRequest,
        request_id: str,
        body_hash: str,
        min_count: int,
        *,
        image: ImageRecord | None,
        network: str = "",
    ) -> BatchResult:
        async def claim(action: SendClaim) -> Answer:
            """The worker's share, in claims whose replies fit in a message, one after the
            other; one refused or lost undoes those made before it (the share is all or
            nothing, as one claim's is)."""
            per_claim = machines_per_claim(body.config, action.record, self._max_payload())
            made: list[Machine] = []
            ledger: int | None = None
            indexes = list(action.indexes)
            try:
                for start in range(0, len(indexes), per_claim):
                    req = BatchClaimRequest(
                        request_id=request_id,
                        body_hash=body_hash,
                        app=app,
                        region=body.region,
                        config=body.config,
                        skip_launch=body.skip_launch,
                        skip_secrets=body.skip_secrets,
                        min_secrets_version=body.min_secrets_version,
                        request_ids=[f"{request_id}-{i}" for i in indexes[start:][:per_claim]],
                        placement=action.record,
                        image=image,
                        network=network,
                    )
                    machines, ledger = await self._claim_batch(action.worker_id, req)
                    made += machines
            except SouqError:
                stranded.extend(await self._undo(app, made))
                raise
            return made, ledger

        stranded: list[str] = []  # made by a share that failed, and not destroyed again

        request = PlacementRequest.for_machine(
            request_id, app, body.region, body.config, image=image
        )
        order = Order(request, count=body.count, min_count=min_count, batch=True)
        auction = self._new_auction(order, self._pipeline)
        done = await self._run(auction, claim, offer_timeout=self._config.batch_offer_timeout_s)
        if stranded:
            log.warning("batch %s: %d machines could not be undone", request_id, len(stranded))
        if done.error is not None and (done.placed or stranded):
            kept = stranded + await self._undo(app, list(done.placed.values()))
            if kept:
                # Said, not hidden: they hold capacity until destroyed, and the list shows them.
                done.error.message += (
                    f"; {len(kept)} of them could not be destroyed and still run: "
                    f"{', '.join(kept[:10])}{' ...' if len(kept) > 10 else ''}"
                )
                done.error.hint = (
                    f"destroy them (`souq machine destroy --force`); "
                    f"GET /v1/apps/{app}/machines lists them"
                )
        self._outcome(auction, done)
        machines = list(done.placed.values())
        return BatchResult(
            requested=body.count,
            placed=len(machines),
            machines=machines,
            unplaced=auction.record.reasons(len(machines)) if len(machines) < body.count else [],
            placement=done.record,
        )

    async def _claim_batch(
        self, worker_id: str, req: BatchClaimRequest
    ) -> tuple[list[Machine], int | None]:
        """One claim of a batch. A worker makes each machine in turn: allow time per machine."""
        timeout = self._config.claim_timeout_s + CLAIM_S_PER_MACHINE * len(req.request_ids)
        reply, ledger = await self._claim_call(worker_id, CLAIM_BATCH, req, timeout=timeout)
        return list(reply.machines), ledger

    def _max_payload(self) -> int:
        """The largest message the bus carries (NATS's ``max_payload``, from the server)."""
        client = getattr(self._workers.transport, "client", None)
        payload = getattr(client, "max_payload", None)
        return payload if isinstance(payload, int) and payload > 0 else DEFAULT_MAX_PAYLOAD

    async def _undo(self, app: str, machines: Sequence[Machine]) -> list[str]:
        """Destroy machines of a batch that fell short of its ``min_count``; the ids of those
        that could not be."""

        async def destroy(machine: Machine) -> str | None:
            cmd = DestroyCommand(app=app, machine_id=machine.id, force=True)
            try:
                await self._workers.call(
                    machine.worker_id, DESTROY, cmd, timeout=self._config.command_timeout_s
                )
            except SouqError as exc:
                log.warning("could not destroy %s of a failed batch: %s", machine.id, exc)
                return machine.id
            return None

        kept = await asyncio.gather(*(destroy(m) for m in machines))
        return [machine_id for machine_id in kept if machine_id is not None]

    # -- driving an auction ----------------------------------------------------------------

    def _auction(
        self,
        order: ClaimRequest,
        purpose: Purpose,
        *,
        find_existing: bool = False,
        volume: tuple[str, str] | None = None,
    ) -> Auction:
        request = PlacementRequest.for_machine(
            order.request_id,
            order.app,
            order.region,
            order.config,
            avoid_workers=self._primaries(order),
            image=order.image,
            volume=volume,
        )
        pipeline = self._pipeline if order.policy is None else self._pipelines.get(order.policy)
        klass = order.config.priority_class
        preempt = self._config.preempt_max_victims if purpose is not Purpose.HOLD else 0
        return self._new_auction(
            Order(
                request,
                purpose=purpose,
                find_existing=find_existing,
                preempt=preempt,
                priority_class=klass,
            ),
            pipeline,
        )

    def _primaries(self, order: ClaimRequest) -> frozenset[str]:
        """A standby's: the workers of the machines it stands by for (each must be known, and of
        the standby's app: another app's machine is answered as one not known, so that its
        existence is not told)."""
        workers = set()
        for machine_id in order.config.standbys:
            worker = self.book.worker_of(machine_id)
            if worker is None or self.book.app_of(machine_id) != order.app:
                raise InvalidInput(
                    f"standbys: machine {machine_id} is not known in app {order.app}",
                    hint="name machines of the same app, created first",
                    details={"field": "config.standbys"},
                )
            workers.add(worker)
        return frozenset(workers)

    def _new_auction(self, order: Order, pipeline: Pipeline) -> Auction:
        return Auction(
            order,
            pipeline=pipeline,
            book=self.book,
            rules=self._rules,
            now=self._clock.monotonic(),
            up_workers=self._liveness.up_workers(order.region),
            live=lambda: self._liveness.live_count(order.region),
            alive=self._liveness.is_live,
        )

    async def _run(
        self, auction: Auction, claim: Claimer, *, offer_timeout: float | None = None
    ) -> Finished:
        """Perform the auction's actions until it finishes."""
        clock = self._clock
        actions = auction.start(clock.monotonic())
        running: dict[asyncio.Task[Answer], SendClaim] = {}
        try:
            while True:
                for action in actions:
                    if isinstance(action, Finished):
                        return action
                    if isinstance(action, AskOffers):
                        offers = await self._ask(auction, action, offer_timeout)
                        actions.extend(auction.offers(offers, clock.monotonic()))
                    else:
                        task = asyncio.get_running_loop().create_task(claim(action))
                        running[task] = action
                actions = []
                if not running:  # pragma: no cover - the core always says what comes next
                    raise SouqError("the placement stopped without an answer")
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    actions.extend(self._answered(auction, running.pop(task), task))
        finally:
            for task in running:
                task.cancel()

    def _answered(
        self, auction: Auction, action: SendClaim, task: asyncio.Task[Answer]
    ) -> list[Any]:
        now = self._clock.monotonic()
        worker_id = action.worker_id
        try:
            answers, ledger = task.result()
        except ClaimRefused as exc:
            log.info("claim on %s for %s refused: %s", worker_id, auction.order.request_id, exc)
            usage = exc.details.get("usage")
            if isinstance(usage, dict):
                with contextlib.suppress(ValueError):
                    self.book.observe_usage(WorkerUsage.model_validate(usage))
            reason = str(exc.details.get("reason", exc.status))
            return auction.refused(worker_id, reason, now, silent=False)
        except Unavailable as exc:
            if not self._workers.connected:
                raise
            log.info("claim on %s for %s unanswered: %s", worker_id, auction.order.request_id, exc)
            if isinstance(exc, NoReply):  # no answer in time: it may have been carried out
                return auction.unanswered(worker_id, exc.status, now)
            # It reached nobody (NobodySubscribed), or the worker answered that it cannot now:
            # nothing was made, the next worker is tried.
            return auction.refused(worker_id, exc.status, now, silent=True)
        return auction.claimed(worker_id, answers, now, ledger=ledger)

    async def _ask(self, auction: Auction, action: AskOffers, timeout: float | None) -> list[Offer]:
        order = auction.order
        image = order.request.image
        ask = OfferRequest(
            request_id=order.request_id,
            app=order.request.app,
            region=order.region,
            resources=order.request.resources,
            image=None if image is None else image.reference,
            image_layers={} if image is None else dict(image.layers),
            priority_class=PriorityClass(order.priority_class) if action.preempt else None,
            max_victims=order.preempt if action.preempt else 0,
        )
        timeout = timeout or self._config.offer_timeout_s
        if action.workers is not None:
            return await self._workers.call_each(list(action.workers), OFFER, ask, timeout=timeout)
        # With no live worker on record (a broker just started, or every worker silent), ask
        # anyway without a count: whoever answers within the deadline is heard.
        return await self._workers.ask_region(
            order.region, ask, expect=action.expect, timeout=timeout
        )

    def _outcome(self, auction: Auction, done: Finished) -> Finished:
        """``done``, or its error raised (no candidate at all: say why there was none)."""
        if done.error is None:
            return done
        if auction.record.considered == 0:
            raise self._nobody(auction, done)
        claims = done.record.claims if isinstance(done.record, Placement) else []
        if claims and all(c.reason == Reason.NETWORK_UNKNOWN for c in claims):
            # Not a want of room: the app's record could not be read (JetStream unavailable),
            # and every worker that could take the machine would give it a private address.
            raise Unavailable(
                "the app's private network cannot be read now (JetStream does not answer), "
                "and the workers with room give every sandboxed machine a private address: "
                "none takes it on a guess",
                hint="retry shortly",
                details={"placement": done.record.model_dump(mode="json")},
            ) from done.error
        raise done.error

    def _nobody(self, auction: Auction, done: Finished) -> SouqError:
        """No candidate at all: an unknown region, no live worker, or nobody answered."""
        region = auction.order.region
        if not self._liveness.knows_region(region):
            known = self._liveness.regions()
            if known:
                return UnknownRegion(
                    f"region {region!r} is unknown; known regions: {', '.join(known)}",
                    hint="pick one of the known regions",
                )
            return UnknownRegion(
                f"region {region!r} is unknown: no worker has announced itself yet",
                hint=f"start a worker with `souq agent --region {region} --nats URL`",
            )
        expected = self._liveness.live_count(region)
        timeout = self._config.offer_timeout_s
        record = done.record
        if isinstance(record, Placement):
            total = record.timings.total_ms
            record = record.model_copy(
                update={
                    "expected_offers": expected,
                    "timings": Timings(gather_ms=total, total_ms=total),
                }
            )
        message = (
            f"no live workers in region {region}{self._down_in(region)}"
            if expected == 0
            else f"no worker in region {region} answered within {timeout:g}s"
        )
        return InsufficientCapacity(
            message,
            hint="check `souq workers`, or try another region",
            details={"placement": record.model_dump(mode="json")},
        )

    def _down_in(self, region: str) -> str:
        """Which of the region's workers are down (unheard for longer than their heartbeats
        allow: crashed, or cut off from this broker), for the message of a refusal."""
        down = sorted(
            wid
            for wid, where, state in self._liveness.states()
            if where == region and state == WorkerState.DOWN
        )
        if not down:
            return ""
        shown = ", ".join(down[:5]) + (f" and {len(down) - 5} more" if len(down) > 5 else "")
        return f": {shown} {'is' if len(down) == 1 else 'are'} down (no heartbeat heard)"


def _noted(record: Placement, order: ClaimRequest) -> Placement:
    """The placement record with why its region was chosen, when the create named none."""
    if order.region_chosen is None:
        return record
    return record.model_copy(update={"region_chosen": order.region_chosen})
