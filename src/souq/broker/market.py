"""The market: solicit offers from a region's workers, rank them, claim on the best.

An order is immediate-or-cancel: the machine is created within the call, or the call raises
:class:`InsufficientCapacity` carrying the placement record that explains why. Phases:

1. **solicit** — scatter an :class:`OfferRequest` on the region's subject and gather the offers
   until every live worker of the region has answered or ``offer_timeout_s`` passes;
2. **recognise** — an offer naming ``existing_machine_id`` means this request id was already
   filled (a retried idempotent create): claim there again, and the worker returns that machine;
3. **rank** — run the placement pipeline (filters with named reasons, bounded scores);
4. **claim** — claim on the best offer; on a refusal or silence try the next, at most
   ``max_claim_attempts`` times.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from souq.broker.config import BrokerConfig
from souq.broker.liveness import Liveness
from souq.broker.wire import ask_worker
from souq.bus import Transport, encode, subjects, unwrap_as
from souq.clock import Clock
from souq.errors import ClaimRefused, InsufficientCapacity, SouqError, Unavailable, UnknownRegion
from souq.model import ClaimAttempt, ClaimRequest, Machine, Offer, OfferRequest, Placement, Timings
from souq.placement import Pipeline, PlacementRequest, Ranking, default_pipeline

__all__ = ["Market"]

log = logging.getLogger(__name__)


class Market:
    def __init__(
        self,
        transport: Transport,
        liveness: Liveness,
        config: BrokerConfig,
        clock: Clock,
        *,
        pipeline: Pipeline | None = None,
    ) -> None:
        self._transport = transport
        self._liveness = liveness
        self._config = config
        self._clock = clock
        self._pipeline = pipeline or default_pipeline()

    async def place(self, order: ClaimRequest) -> Machine:
        """Place ``order`` (a claim without its placement record yet) and return the machine."""
        started = self._clock.monotonic()
        expected = self._liveness.live_count(order.region)
        offers = await self._solicit(order, expected)
        gathered = self._clock.monotonic()
        if not offers:
            raise self._no_offers(order, expected, gathered - started)

        existing = next((o for o in offers if o.existing_machine_id), None)
        if existing is not None:
            # The worker recognises the request id and returns the machine it made (or refuses
            # with idempotency_conflict when the body differs).
            result = await ask_worker(
                self._transport,
                existing.worker.id,
                "claim",
                order,
                timeout=self._config.claim_timeout_s,
            )
            return unwrap_as(result, Machine)

        request = PlacementRequest(
            request_id=order.request_id,
            app=order.app,
            region=order.region,
            resources=order.config.guest.resources(),
        )
        ranking = self._pipeline.rank(request, offers)
        ranked = self._clock.monotonic()
        record = Placement(
            request_id=order.request_id,
            region=order.region,
            policy=self._pipeline.name,
            expected_offers=expected,
            offers_received=len(offers),
            rejections=ranking.rejections,
            offers=ranking.outcomes,
            runner_up=ranking.runner_up,
        )

        def timings(now: float) -> Timings:
            return Timings(
                gather_ms=_ms(gathered - started),
                rank_ms=_ms(ranked - gathered),
                claim_ms=_ms(now - ranked),
                total_ms=_ms(now - started),
            )

        claims: list[ClaimAttempt] = []
        for offer in ranking.ordered[: self._config.max_claim_attempts]:
            worker_id = offer.worker.id
            # The record the worker stores with the machine names this claim as the winner: it
            # is only kept if the claim succeeds.
            attempt = record.model_copy(
                update={
                    "winner": worker_id,
                    "runner_up": _runner_up(ranking, worker_id),
                    "claims": [*claims, ClaimAttempt(worker_id=worker_id, ok=True)],
                    "timings": timings(self._clock.monotonic()),
                }
            )
            claim = order.model_copy(update={"placement": attempt})
            try:
                reply = await ask_worker(
                    self._transport,
                    worker_id,
                    "claim",
                    claim,
                    timeout=self._config.claim_timeout_s,
                )
                machine = unwrap_as(reply, Machine)
            except (ClaimRefused, Unavailable) as exc:
                log.info("claim on %s for %s failed: %s", worker_id, order.request_id, exc)
                claims.append(ClaimAttempt(worker_id=worker_id, ok=False, reason=exc.status))
                continue
            # Answer with the final timings (the stored record was written before the claim).
            final = attempt.model_copy(update={"timings": timings(self._clock.monotonic())})
            return machine.model_copy(update={"placement": final})

        failed = record.model_copy(
            update={
                "claims": claims,
                "runner_up": None,
                "timings": timings(self._clock.monotonic()),
            }
        )
        raise _insufficient(order, failed)

    async def _solicit(self, order: ClaimRequest, expected: int) -> list[Offer]:
        ask = OfferRequest(
            request_id=order.request_id,
            app=order.app,
            region=order.region,
            resources=order.config.guest.resources(),
        )
        # With no live worker on record (a broker just started, or every worker silent), ask
        # anyway without a count: whoever answers within the deadline is heard.
        replies = await self._transport.gather(
            subjects.offers(order.region),
            encode(ask),
            expect=expected or None,
            timeout=self._config.offer_timeout_s,
        )
        return _decode_offers(replies)

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
            policy=self._pipeline.name,
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


def _decode_offers(replies: Sequence[bytes]) -> list[Offer]:
    offers: list[Offer] = []
    for data in replies:
        try:
            offers.append(unwrap_as(data, Offer))
        except (SouqError, ValueError) as exc:
            log.warning("ignoring an offer that could not be read: %s", exc)
    return offers


def _runner_up(ranking: Ranking, winner: str) -> str | None:
    return next((o.worker.id for o in ranking.ordered if o.worker.id != winner), None)


def _insufficient(order: ClaimRequest, record: Placement) -> InsufficientCapacity:
    guest = order.config.guest
    reasons = [f"{n} {reason}" for reason, n in sorted(record.rejections.items())]
    refused = sum(1 for c in record.claims if not c.ok)
    if refused:
        reasons.append(f"{refused} claim{'s' if refused > 1 else ''} refused")
    silent = record.expected_offers - record.offers_received
    if silent > 0:
        reasons.append(f"{silent} did not answer")
    return InsufficientCapacity(
        f"no worker in region {order.region} can take {guest.cpus:g} cpus / "
        f"{guest.memory_mb} MiB: {', '.join(reasons) or 'no offers'}",
        hint="ask for fewer resources, free capacity (destroy machines), or add workers",
        details={"placement": record.model_dump(mode="json")},
    )


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
