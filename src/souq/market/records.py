"""The placement record of an auction as it goes: every placement explains itself. Pure.

A :class:`RecordKeeper` follows one :class:`~souq.market.auction.Auction`: where its candidates
came from (the book, or offers asked), the rejections by reason and what was not met, every
candidate's scores, each claim tried, and the timings of the phases. It writes the record a
worker stores with each machine (:meth:`RecordKeeper.share`), the record the caller gets
(:meth:`RecordKeeper.final`: a :class:`~souq.model.Placement` for one machine, a
:class:`~souq.model.batch.BatchPlacement` for a batch), and the refusal when too few were placed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from souq.errors import InsufficientCapacity
from souq.market.orders import Order
from souq.model.batch import BatchClaim, BatchPlacement
from souq.model.placement import (
    ClaimAttempt,
    OfferOutcome,
    Placement,
    Preemption,
    Sampling,
    Timings,
)
from souq.placement import Pipeline, Ranking

__all__ = ["RECORD_OFFERS", "RecordKeeper"]

RECORD_OFFERS = 50  # candidates listed in a batch's record (the counts cover all of them)


class RecordKeeper:
    def __init__(self, order: Order, pipeline: Pipeline, *, started: float) -> None:
        self._order = order
        self._pipeline = pipeline
        self.source = "offers"
        self._started = started
        self._gathered: float | None = None
        self._ranked: float | None = None
        self._expected = 0
        self._received = 0
        self._considered = 0
        self._sampled: Sampling | None = None
        self._rejections: Counter[str] = Counter()
        self._unmet: dict[str, list[str]] = {}
        self._outcomes: list[OfferOutcome] = []
        self._order_of: list[tuple[float, int, str]] = []  # (-score, rank, worker): best first
        self._attempts: list[ClaimAttempt] = []
        self._batch_claims: list[BatchClaim] = []
        self._rounds = 0
        self._preemption: Preemption | None = None

    @property
    def rounds(self) -> int:
        """Claim rounds sent so far."""
        return self._rounds

    @property
    def considered(self) -> int:
        """Candidates the auction saw at all (drawn from the book, or offers received)."""
        return self._considered

    # -- what happened ---------------------------------------------------------------------

    def restart(self) -> None:
        """The candidates so far are superseded (fresh offers follow the book's): forget how
        they ranked; the claims tried stay."""
        self.source = "offers"
        self._expected = self._received = 0
        self._sampled = None
        self._rejections.clear()
        self._unmet.clear()
        self._outcomes.clear()
        self._order_of.clear()

    def asking(self, sample: list[str] | None, population: int) -> None:
        self._expected += len(sample) if sample is not None else population
        if sample is not None:
            asked = len(sample) + (self._sampled.asked if self._sampled else 0)
            self._sampled = Sampling(asked=asked, of=population, seed=self._order.request_id)

    def received(self, count: int, now: float) -> None:
        self._received += count
        self._considered += count
        self._gathered = self._gathered or now

    def drew(self, count: int, population: int, now: float) -> None:
        self.source = "book"
        self._expected += count
        self._received += count
        self._considered += count
        asked = count + (self._sampled.asked if self._sampled else 0)
        if asked < population:
            self._sampled = Sampling(asked=asked, of=population, seed=self._order.request_id)
        self._gathered = self._gathered or now

    def preempting(self, preemption: Preemption) -> None:
        """No worker had room: the offers that follow say whom each would displace."""
        self._preemption = preemption

    def ranked(
        self, ranking: Ranking, now: float, *, preempts: dict[str, int] | None = None
    ) -> None:
        """The candidates so far were ranked (where they came from, :meth:`drew` or
        :meth:`restart` said); ``preempts``: how many machines each would displace."""
        for reason, n in ranking.rejections.items():
            self._rejections[reason] += n
        for reason, items in ranking.unmet.items():
            known = self._unmet.setdefault(reason, [])
            known.extend(i for i in items if i not in known)
        base = len(self._order_of)
        for i, outcome in enumerate(o for o in ranking.outcomes if o.score is not None):
            self._order_of.append((-(outcome.score or 0.0), base + i, outcome.worker_id))
        self._order_of.sort()
        if preempts:
            self._outcomes.extend(
                o.model_copy(update={"preempts": preempts[o.worker_id]})
                if o.worker_id in preempts
                else o
                for o in ranking.outcomes
            )
        else:
            self._outcomes.extend(ranking.outcomes)
        self._ranked = now

    def claiming(self, now: float) -> None:
        self._rounds += 1
        self._ranked = self._ranked or now

    def claim(self, worker_id: str, count: int, *, ok: bool, reason: str | None = None) -> None:
        if self._order.batch:
            self._batch_claims.append(
                BatchClaim(worker_id=worker_id, count=count, ok=ok, reason=reason)
            )
        else:
            self._attempts.append(ClaimAttempt(worker_id=worker_id, ok=ok, reason=reason))

    # -- records ---------------------------------------------------------------------------

    def timings(self, now: float) -> Timings:
        gathered = self._gathered if self._gathered is not None else now
        ranked = self._ranked if self._ranked is not None else gathered
        return Timings(
            gather_ms=_ms(gathered - self._started),
            rank_ms=_ms(ranked - gathered),
            claim_ms=_ms(now - ranked),
            total_ms=_ms(now - self._started),
        )

    def _runner_up(self, winner: str | None) -> str | None:
        return next((w for _, _, w in self._order_of if w != winner), None)

    def _best(self) -> str | None:
        return self._order_of[0][2] if self._order_of else None

    def _placement(self, now: float, **fields: Any) -> Placement:
        return Placement(
            request_id=self._order.request_id,
            region=self._order.region,
            policy=self._pipeline.name,
            weights=self._pipeline.weights,
            unmet=self._unmet,
            expected_offers=self._expected,
            offers_received=self._received,
            rejections=dict(self._rejections),
            timings=self.timings(now),
            sampled=self._sampled,
            source=self.source,
            preemption=self._preemption,
            **fields,
        )

    def share(self, worker_id: str, now: float | None = None) -> Placement:
        """The record the worker stores with the machines it is sent: it names the worker as
        the winner, which holds if the claim succeeds."""
        at = now if now is not None else (self._ranked or self._started)
        if not self._order.batch:
            return self._placement(
                at,
                offers=self._outcomes,
                winner=worker_id,
                runner_up=self._runner_up(worker_id),
                claims=[*self._attempts, ClaimAttempt(worker_id=worker_id, ok=True)],
            )
        return self._placement(
            at,
            offers=[o for o in self._outcomes if o.worker_id == worker_id][:1],
            winner=worker_id,
            runner_up=self._runner_up(worker_id),
            claims=[ClaimAttempt(worker_id=worker_id, ok=True)],
        )

    def final(
        self, placed: dict[int, Any], now: float, *, best: str | None = None
    ) -> Placement | BatchPlacement:
        """The record the caller gets; ``best``: a dry run's winner as the auction ranked it
        (when it ranks by more than the score: a preempting create's victims)."""
        order = self._order
        if order.batch:
            return self._batch(placed, now)
        if order.purpose == "explain":
            best = best or self._best()
            return self._placement(
                now, offers=self._outcomes, winner=best, runner_up=self._runner_up(best)
            )
        if placed:
            winner = next((a.worker_id for a in reversed(self._attempts) if a.ok), None)
            return self._placement(
                now,
                offers=self._outcomes,
                winner=winner,
                runner_up=self._runner_up(winner),
                claims=self._attempts,
            )
        return self._placement(now, offers=self._outcomes, claims=self._attempts)

    def _batch(self, placed: dict[int, Any], now: float) -> BatchPlacement:
        order = self._order
        assignments = Counter(getattr(m, "worker_id", "") for m in placed.values())
        scored = sorted(
            (o for o in self._outcomes if o.score is not None), key=lambda o: -(o.score or 0.0)
        )
        timings = self.timings(now)
        return BatchPlacement(
            request_id=order.request_id,
            region=order.region,
            policy=self._pipeline.name,
            requested=order.count,
            min_count=order.min_count,
            placed=len(placed),
            expected_offers=self._expected,
            offers_received=self._received,
            sampled=self._sampled,
            rejections=dict(self._rejections),
            offers=scored[:RECORD_OFFERS],
            assignments=dict(assignments),
            claims=list(self._batch_claims),
            rounds=self._rounds,
            timings=timings.model_copy(update={"claim_ms": timings.claim_ms + timings.rank_ms}),
            source=self.source,
        )

    # -- refusals --------------------------------------------------------------------------

    def reasons(self, placed: int) -> list[str]:
        """Why machines were not placed, in words: rejections by reason (with what was not met),
        refused claims, silent workers."""
        order = self._order
        if not order.batch:
            reasons = [
                f"{n} {reason} ({'; '.join(self._unmet[reason])})"
                if self._unmet.get(reason)
                else f"{n} {reason}"
                for reason, n in sorted(self._rejections.items())
            ]
            refused = [c.reason or "refused" for c in self._attempts if not c.ok]
            if refused:
                why = ", ".join(sorted(set(refused)))
                plural = "s" if len(refused) > 1 else ""
                reasons.append(f"{len(refused)} claim{plural} refused ({why})")
        else:
            reasons = [f"{n} offers {reason}" for reason, n in sorted(self._rejections.items())]
            refused_batches = [c for c in self._batch_claims if not c.ok]
            if refused_batches:
                reasons.append(
                    f"{len(refused_batches)} batch claims refused "
                    f"({sum(c.count for c in refused_batches)})"
                )
            if self._sampled is not None:
                reasons.append(f"asked a sample of {self._sampled.asked} workers")
        silent = self._expected - self._received
        if silent > 0:
            reasons.append(f"{silent} did not answer")
        if order.batch and placed < order.count:
            reasons.insert(0, f"{order.count - placed} of {order.count} not placed")
        return reasons

    def shortfall(self, placed: dict[int, Any], now: float) -> InsufficientCapacity:
        order = self._order
        record = self.final(placed, now)
        reasons = self.reasons(len(placed))
        if order.batch:
            return InsufficientCapacity(
                f"placed {len(placed)} of {order.count} machines in region {order.region}, "
                f"fewer than min_count {order.min_count} (the {len(placed)} made were "
                f"destroyed): {', '.join(reasons) or 'no offers'}",
                hint="ask for fewer machines, lower min_count, free capacity or add workers",
                details={"placement": record.model_dump(mode="json")},
            )
        want = order.request.resources
        return InsufficientCapacity(
            f"no worker in region {order.region} can take {want.cpus:g} cpus / "
            f"{want.memory_mb} MiB: {', '.join(reasons) or 'no offers'}",
            hint=(
                "relax the constraints, or add workers that meet them (see `souq workers`)"
                if self._unmet and set(self._rejections) <= set(self._unmet)
                else "ask for fewer resources, free capacity (destroy machines), or add workers"
            ),
            details={"placement": record.model_dump(mode="json")},
        )


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
