"""The market: solicit offers from a region's workers, rank them, claim on the best.

An order is immediate-or-cancel: the machine is created within the call, or the call raises
:class:`InsufficientCapacity` carrying the placement record that explains why. Phases:

1. **solicit** — scatter an :class:`OfferRequest` on the region's subject and gather the offers
   until every live worker of the region has answered or ``offer_timeout_s`` passes;
2. **recognise** — an offer naming ``existing_machine_id`` means this request id was already
   filled (a retried idempotent create): claim there again, and the worker returns that machine;
3. **rank** — run the placement pipeline (filters with named reasons, bounded scores);
4. **claim** — claim on the best offer; on a refusal try the next, down the whole ranking; on
   silence try the next too, but give up after ``max_claim_attempts`` unanswered claims.

A dry run (:meth:`Market.explain`) stops after phase 3; a quote (:meth:`Market.hold`) runs phase
4 with ``hold`` instead of ``claim``: the worker reserves the capacity for a while, no machine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel

from souq.broker.config import BrokerConfig
from souq.broker.liveness import Liveness
from souq.broker.sampling import plan_sample
from souq.clock import Clock
from souq.errors import (
    ClaimRefused,
    IdempotencyConflict,
    InsufficientCapacity,
    SouqError,
    Unavailable,
    UnknownRegion,
)
from souq.ids import new_quote_id
from souq.model import (
    ClaimAttempt,
    ClaimRequest,
    HoldRequest,
    Machine,
    Offer,
    OfferRequest,
    Placement,
    Quote,
    Timings,
)
from souq.model.placement import Sampling
from souq.placement import Pipeline, PipelineCache, PlacementRequest, Ranking
from souq.protocol import Verb, WorkerClient
from souq.protocol.verbs import CLAIM, HOLD, OFFER

__all__ = ["Market"]

log = logging.getLogger(__name__)

Q = TypeVar("Q", bound=BaseModel)
R = TypeVar("R")


class Market:
    def __init__(
        self,
        workers: WorkerClient,
        liveness: Liveness,
        config: BrokerConfig,
        clock: Clock,
        *,
        pipeline: Pipeline | None = None,
    ) -> None:
        self._workers = workers
        self._liveness = liveness
        self._config = config
        self._clock = clock
        # Pipelines by placement policy (a create's, over the broker's default); ``pipeline``
        # replaces the default one (tests).
        self._pipelines = PipelineCache(config.placement)
        self._pipeline = pipeline or self._pipelines.default

    async def place(self, order: ClaimRequest) -> Machine:
        """Place ``order`` (a claim without its placement record yet) and return the machine."""
        auction = await self._open(order)
        if auction.existing is not None:
            # The worker recognises the request id and returns the machine it made (or refuses
            # with idempotency_conflict when the body differs).
            return await self._workers.call(
                auction.existing, CLAIM, order, timeout=self._config.claim_timeout_s
            )

        def claim(worker_id: str, record: Placement) -> ClaimRequest:
            return order.model_copy(update={"placement": record})

        machine, final = await self._close(auction, CLAIM, claim)
        return machine.model_copy(update={"placement": final})

    async def explain(self, order: ClaimRequest) -> Placement:
        """A dry run: the placement record of ``order`` as if placed now, claiming nothing.
        Raises :class:`InsufficientCapacity` (with the record) when nothing would fit."""
        auction = await self._open(order)
        if auction.existing is not None:
            raise IdempotencyConflict(
                f"request {order.request_id} already made machine {auction.existing_machine}",
                hint="a dry run with a used idempotency key would place nothing",
                details={"machine_id": auction.existing_machine},
            )
        ranking, record = auction.ranking, auction.record
        if ranking.winner is None:
            raise _insufficient(order, record.model_copy(update={"timings": auction.timings()}))
        return record.model_copy(update={"winner": ranking.winner, "timings": auction.timings()})

    async def hold(self, order: ClaimRequest, *, ttl_s: float) -> Quote:
        """A dry run that binds: hold capacity for ``order`` on the best worker for ``ttl_s``."""
        auction = await self._open(order)

        def hold(worker_id: str, record: Placement) -> HoldRequest:
            return HoldRequest(
                quote_id=new_quote_id(worker_id),
                app=order.app,
                region=order.region,
                config=order.config,
                ttl_s=ttl_s,
                placement=record,
            )

        quote, final = await self._close(auction, HOLD, hold)
        return quote.model_copy(update={"placement": final})

    # -- phases ----------------------------------------------------------------------------

    async def _open(self, order: ClaimRequest) -> _Auction:
        """Solicit offers and rank them."""
        started = self._clock.monotonic()
        offers, expected, sampled = await self._solicit(order)
        gathered = self._clock.monotonic()
        if not offers:
            raise self._no_offers(order, expected, gathered - started)
        existing = next((o for o in offers if o.existing_machine_id), None)
        request = PlacementRequest.for_machine(
            order.request_id, order.app, order.region, order.config
        )
        pipeline = self._pipeline_for(order)
        ranking = pipeline.rank(request, offers)
        record = Placement(
            request_id=order.request_id,
            region=order.region,
            policy=pipeline.name,
            weights=pipeline.weights,
            unmet=ranking.unmet,
            expected_offers=expected,
            offers_received=len(offers),
            rejections=ranking.rejections,
            offers=ranking.outcomes,
            runner_up=ranking.runner_up,
            sampled=sampled,
        )
        return _Auction(
            order=order,
            ranking=ranking,
            record=record,
            clock=self._clock,
            started=started,
            gathered=gathered,
            ranked=self._clock.monotonic(),
            existing=existing.worker.id if existing else None,
            existing_machine=existing.existing_machine_id if existing else None,
        )

    async def _close(
        self,
        auction: _Auction,
        verb: Verb[Q, R],
        build: Callable[[str, Placement], Q],
    ) -> tuple[R, Placement]:
        """Claim (``verb``) on the best offer, falling back to the next on a refusal or silence
        (at most ``max_claim_attempts`` silences). Returns the worker's answer and the final
        record."""
        ranking, record = auction.ranking, auction.record
        claims: list[ClaimAttempt] = []
        silent = 0
        # Down the whole ranking: a refusal (another broker took the room first) costs one
        # round trip, and giving up while a worker that answered still has room would leave
        # capacity unused under contention. Only unanswered claims are bounded.
        for offer in ranking.ordered:
            if silent >= self._config.max_claim_attempts:
                break
            worker_id = offer.worker.id
            # The record the worker stores names this claim as the winner: it is only kept if
            # the claim succeeds.
            attempt = record.model_copy(
                update={
                    "winner": worker_id,
                    "runner_up": _runner_up(ranking, worker_id),
                    "claims": [*claims, ClaimAttempt(worker_id=worker_id, ok=True)],
                    "timings": auction.timings(),
                }
            )
            try:
                answer = await self._workers.call(
                    worker_id, verb, build(worker_id, attempt), timeout=self._config.claim_timeout_s
                )
            except (ClaimRefused, Unavailable) as exc:
                log.info("%s on %s for %s failed: %s", verb.name, worker_id, record.request_id, exc)
                claims.append(ClaimAttempt(worker_id=worker_id, ok=False, reason=exc.status))
                silent += isinstance(exc, Unavailable)
                continue
            # Answer with the final timings (the stored record was written before the claim).
            return answer, attempt.model_copy(update={"timings": auction.timings()})

        failed = record.model_copy(
            update={"claims": claims, "runner_up": None, "timings": auction.timings()}
        )
        raise _insufficient(auction.order, failed)

    async def _solicit(self, order: ClaimRequest) -> tuple[list[Offer], int, Sampling | None]:
        """Ask for offers: every worker of the region on its subject, or, past
        ``sample_above`` up workers, a random sample seeded from the request id, each on its
        own ``offer`` verb (see :mod:`souq.broker.sampling`). Returns the offers, how many
        answers were expected, and the sample drawn (None when everyone was asked)."""
        ask = OfferRequest(
            request_id=order.request_id,
            app=order.app,
            region=order.region,
            resources=order.config.guest.resources(),
        )
        config = self._config
        plan = plan_sample(
            order.request_id,
            self._liveness.up_workers(order.region),
            above=config.sample_above,
            factor_d=config.sample_factor_d,
            minimum=config.sample_min,
        )
        if plan.workers is not None:
            offers = await self._workers.call_each(
                plan.workers, OFFER, ask, timeout=config.offer_timeout_s
            )
            sampled = Sampling(asked=len(plan.workers), of=plan.population, seed=order.request_id)
            return offers, len(plan.workers), sampled
        expected = self._liveness.live_count(order.region)
        # With no live worker on record (a broker just started, or every worker silent), ask
        # anyway without a count: whoever answers within the deadline is heard.
        offers = await self._workers.ask_region(
            order.region, ask, expect=expected or None, timeout=config.offer_timeout_s
        )
        return offers, expected, None

    def _pipeline_for(self, order: ClaimRequest) -> Pipeline:
        return self._pipeline if order.policy is None else self._pipelines.get(order.policy)

    def _no_offers(self, order: ClaimRequest, expected: int, gather_s: float) -> SouqError:
        region = order.region
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
        record = Placement(
            request_id=order.request_id,
            region=region,
            policy=self._pipeline_for(order).name,
            expected_offers=expected,
            timings=Timings(gather_ms=_ms(gather_s), total_ms=_ms(gather_s)),
        )
        message = (
            f"no live workers in region {region}"
            if expected == 0
            else f"no worker in region {region} answered within {self._config.offer_timeout_s:g}s"
        )
        return InsufficientCapacity(
            message,
            hint="check `souq workers`, or try another region",
            details={"placement": record.model_dump(mode="json")},
        )


@dataclass(frozen=True)
class _Auction:
    """One placement between its phases: offers ranked, claims not yet made."""

    order: ClaimRequest
    ranking: Ranking
    record: Placement
    clock: Clock
    started: float
    gathered: float
    ranked: float
    existing: str | None  # a worker that already made a machine for this request id
    existing_machine: str | None

    def timings(self) -> Timings:
        now = self.clock.monotonic()
        return Timings(
            gather_ms=_ms(self.gathered - self.started),
            rank_ms=_ms(self.ranked - self.gathered),
            claim_ms=_ms(now - self.ranked),
            total_ms=_ms(now - self.started),
        )


def _runner_up(ranking: Ranking, winner: str) -> str | None:
    return next((o.worker.id for o in ranking.ordered if o.worker.id != winner), None)


def _insufficient(order: ClaimRequest, record: Placement) -> InsufficientCapacity:
    guest = order.config.guest
    reasons = [
        # Name what the request asked and nobody met, e.g. "2 constraint (label.disk = ssd)".
        f"{n} {reason} ({'; '.join(record.unmet[reason])})"
        if record.unmet.get(reason)
        else f"{n} {reason}"
        for reason, n in sorted(record.rejections.items())
    ]
    refused = sum(1 for c in record.claims if not c.ok)
    if refused:
        reasons.append(f"{refused} claim{'s' if refused > 1 else ''} refused")
    silent = record.expected_offers - record.offers_received
    if silent > 0:
        reasons.append(f"{silent} did not answer")
    return InsufficientCapacity(
        f"no worker in region {order.region} can take {guest.cpus:g} cpus / "
        f"{guest.memory_mb} MiB: {', '.join(reasons) or 'no offers'}",
        hint=(
            "relax the constraints, or add workers that meet them (see `souq workers`)"
            if record.unmet and set(record.rejections) <= set(record.unmet)
            else "ask for fewer resources, free capacity (destroy machines), or add workers"
        ),
        details={"placement": record.model_dump(mode="json")},
    )


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
