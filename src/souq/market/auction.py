"""The placement core: one order of ``count`` machines, from candidates to claims. Pure.

Sans-I/O: an :class:`Auction` takes events and returns actions; the broker's shell
(:mod:`souq.broker.market`) performs the actions over the bus and feeds the answers back, and a
simulator or a test can do the same with no bus at all. Single creates, batches, quotes and dry
runs are all auctions; they differ in ``count`` and in what a claim asks the worker to do.

Phases:

1. **candidates** — from the broker's book (:class:`~souq.market.book.WorkerBook`): workers drawn
   at random until enough have room, no worker asked. When the book cannot answer (it knows no
   worker of the region, an idempotency key must find an earlier machine, or nobody in the book
   has room) the action is :class:`AskOffers`: the region's workers, or a seeded sample of them,
   are asked for fresh offers;
2. **rank** — the placement pipeline filters and scores the candidates (once);
3. **assign** — each machine goes to the best-scored worker, whose offer is then charged with it
   and scored again, so that best-fit fills a worker to a comfortable level, then moves on;
4. **claim** — one :class:`SendClaim` per chosen worker. A refusal drops that worker and
   re-assigns its machines to the next; when the ranking runs out, more candidates are drawn (or
   offers asked); unanswered claims and claim rounds are bounded by the :class:`Rules`;
5. **preempt** — a single machine (a create or a dry run) that fits nowhere and whose class may
   displace others (``Order.preempt``: at most that many machines) looks again at the workers
   as they would stand once lower classes gave their room back. A create whose book knew no
   worker with room draws from the book once more, each worker's room including what its lower
   classes could free (as its heartbeats and usage say), and claims at once: no offers asked.
   Otherwise (a dry run, a book that does not say, a region whose room the book got wrong) it
   asks for offers once more, each saying whom the worker would displace
   (:mod:`souq.market.preemption`). Either way the ranking puts first the fewest, lowest-class,
   cheapest victims (the book's an estimate), and the pipeline's score among equals, and the
   claim tells the worker it may displace: it chooses the victims on its own ledger;
6. **finish** — :class:`Finished` with what was placed, the placement record, and the error when
   fewer than ``min_count`` were placed (immediate-or-cancel: nothing waits).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from souq.errors import IdempotencyConflict, InsufficientCapacity, SouqError, Unavailable
from souq.market.book import WorkerBook
from souq.market.orders import Order, Purpose
from souq.market.preemption import RANK, may_displace
from souq.market.records import RecordKeeper
from souq.market.sampling import plan_sample
from souq.model.placement import Preemption
from souq.model.protocol import Offer
from souq.model.reasons import SHORT_OF_ROOM
from souq.model.resources import Resources
from souq.placement import Pipeline

__all__ = [
    "Action",
    "AskOffers",
    "Auction",
    "Finished",
    "Rules",
    "SendClaim",
]


@dataclass(frozen=True)
class Rules:
    """The broker's bounds on one auction (from its config)."""

    use_book: bool = True  # candidates from the book; else always ask offers
    candidates: int = 8  # workers with room the book proposes for one machine (d)
    factor_d: float = 2.0  # Sparrow's d: room for d x m machines among the candidates
    sample_above: int = 64  # asking offers: past this many up workers, ask a sample
    sample_min: int = 8
    max_silent: int = 3  # claims nobody answered, before giving up
    max_rounds: int = 3  # claim rounds of a batch in a row that place nothing
    max_draw: int = 256  # workers the book looks at for one round of candidates


# -- actions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AskOffers:
    """Ask for fresh offers: ``workers`` each on its own subject, or (None) the whole region,
    expecting ``expect`` answers."""

    workers: tuple[str, ...] | None
    expect: int | None
    preempt: bool = False  # each offer says whom the worker would displace


@dataclass(frozen=True)
class SendClaim:
    """Claim machines ``indexes`` of the order on ``worker_id``; the worker stores ``record``.
    ``existing``: the worker already made the machine for this request id and returns it."""

    worker_id: str
    indexes: tuple[int, ...]
    record: Any  # Placement: this worker's share of the record
    existing: bool = False
    preempt: int = 0  # the worker may displace this many machines to make room


@dataclass(frozen=True)
class Finished:
    """The end: ``placed`` maps each placed index to the worker's answer; ``error`` is set when
    the order failed (fewer than ``min_count``, nothing to rank ...)."""

    placed: dict[int, Any]
    record: Any  # Placement (one machine) or BatchPlacement
    error: SouqError | None = None


Action = AskOffers | SendClaim | Finished


class _Source(StrEnum):
    BOOK = "book"
    OFFERS = "offers"


# Preemption first (the fewest, lowest-class, cheapest victims: OfferedEviction.key), then the
# best score, then the ranking's order.
_Key = tuple[int, int, int, float, int, float, int]
_NO_EVICTION = (-1, 0, 0, 0.0, 0)


@dataclass(order=True)
class _Slot:
    key: _Key
    offer: Offer = field(compare=False)


# -- the core ---------------------------------------------------------------------------------


class Auction:
    def __init__(
        self,
        order: Order,
        *,
        pipeline: Pipeline,
        book: WorkerBook,
        rules: Rules,
        now: float,
        up_workers: Sequence[str] = (),
        live: Callable[[], int] = lambda: 0,
        alive: Callable[[str], bool] | None = None,
    ) -> None:
        """``up_workers``: the region's up workers, sorted (whom a sample of offers is drawn
        from); ``live()``: how many of the region's workers answer (up or cordoned);
        ``alive(worker_id)``: whether the broker hears the worker and it takes machines."""
        self.order = order
        self._pipeline = pipeline
        self._book = book
        self._rules = rules
        self._up = up_workers  # not copied: a large region's list is the broker's cached one
        self._live = live
        self._alive = alive or (lambda _: True)
        self._want: Resources = order.request.resources
        self._heap: list[_Slot] = []
        self._seen: set[str] = set()  # workers considered (offered or drawn)
        self._dropped: set[str] = set()  # workers refused or silent this auction
        self._pending = list(range(order.count))
        self._outstanding: dict[str, tuple[int, ...]] = {}
        self._placed: dict[int, Any] = {}
        self._silent = 0
        self._futile = 0  # claim rounds in a row that placed nothing
        self._placed_before = 0  # placed when the last round was sent
        self._refills = 0
        self._asked_offers = False
        self._existing: str | None = None
        self._asked_again: set[str] = set()  # workers whose unanswered claim was sent again
        self._unknown: dict[str, tuple[int, ...]] = {}  # unanswered twice: made, or not?
        self._ranked_base = 0
        self._preempting = False
        # Some worker was short of room for it (an offer, or a claim refused, for that): what
        # displacing machines can change, unlike a worker that did not answer.
        self._short_of_room = False
        # The classes a machine of this order may displace, lowest first.
        self._displace = tuple(c for c in RANK if may_displace(order.priority_class, c))
        self.record = RecordKeeper(order, pipeline, started=now)

    @property
    def existing(self) -> str | None:
        """The worker that had already made the machine (an idempotent retry), if any."""
        return self._existing

    # -- events ----------------------------------------------------------------------------

    def start(self, now: float) -> list[Action]:
        rules, order = self._rules, self.order
        if not rules.use_book or order.find_existing or not self._book.knows(order.region):
            return [self._ask_offers()]
        if not self._draw(now):
            # Nobody in the book has room: ask, it may be stale. A create that may displace
            # draws again, each worker with what lower classes could free there, and claims;
            # a dry run (or a book that cannot tell) asks whom each worker would displace
            # (one with room says so too).
            if self._may_preempt():
                reason = "the book knew no worker with room for it as it is"
                if order.purpose is Purpose.CLAIM:
                    self._begin_preempting(reason)
                    if self._draw(now):
                        return self._next(now)
                    return [self._ask_offers(preempt=True)]
                return [self._preempt(reason)]
            return [self._ask_offers()]
        return self._next(now)

    def offers(self, offers: Sequence[Offer], now: float) -> list[Action]:
        """Offers arrived (those that were asked and answered)."""
        self.record.received(len(offers), now)
        existing = next((o for o in offers if o.existing_machine_id), None)
        if existing is not None:
            if self.order.purpose is Purpose.EXPLAIN:
                return [self._finish(now, error=self._used_key(existing))]
            self._existing = existing.worker.id
            self._outstanding[existing.worker.id] = (0,)
            return [SendClaim(existing.worker.id, (0,), None, existing=True)]
        self._rank(offers, now)
        return self._next(now)

    def claimed(
        self,
        worker_id: str,
        answers: Sequence[Any],
        now: float,
        *,
        ledger: int | None = None,
    ) -> list[Action]:
        """The worker made (or held) the machines it was sent, one answer per index;
        ``ledger``: its ledger version once it had (the book counts the claim until then)."""
        indexes = self._outstanding.pop(worker_id, ())
        for index, answer in zip(indexes, answers, strict=True):
            self._placed[index] = answer
        if self._existing == worker_id:
            return [self._finish(now)]
        self.record.claim(worker_id, len(indexes), ok=True)
        if self.order.purpose is not Purpose.EXPLAIN:
            self._book.charge(worker_id, self._want, count=len(indexes), version=ledger)
        return self._next(now)

    def refused(self, worker_id: str, reason: str, now: float, *, silent: bool) -> list[Action]:
        """The claim on ``worker_id`` was refused (``reason``: the status or the refusal's
        reason), or it reached nobody (``silent``: the worker is not there to hear it). A claim
        sent again after it went unanswered that reaches nobody (the worker died meanwhile) is
        unanswered still: the first may have been carried out all the same."""
        if silent and worker_id in self._asked_again and worker_id in self._outstanding:
            return self.unanswered(worker_id, reason, now)
        indexes = self._outstanding.pop(worker_id, ())
        self.record.claim(worker_id, len(indexes), ok=False, reason=reason)
        self._short_of_room |= _for_room(reason)
        self._silent += silent
        self._dropped.add(worker_id)
        self._heap = [s for s in self._heap if s.offer.worker.id != worker_id]
        heapq.heapify(self._heap)
        self._pending.extend(indexes)
        self._pending.sort()
        return self._next(now)

    def unanswered(self, worker_id: str, reason: str, now: float) -> list[Action]:
        """The claim on ``worker_id`` reached it but no answer came back in time. It may still
        have been carried out (the answer lost, not the claim), and claiming its machines
        elsewhere could make them twice. It is sent once more to the same worker (which knows a
        claim by its request id and answers a repeat with what it made); if that goes
        unanswered too, its machines are neither claimed elsewhere nor counted as refused: the
        order ends ``unavailable``, naming the worker where they may be."""
        if self.order.purpose is Purpose.EXPLAIN or not self._outstanding.get(worker_id):
            return self.refused(worker_id, reason, now, silent=True)
        indexes = self._outstanding.pop(worker_id)
        if worker_id not in self._asked_again:
            self._asked_again.add(worker_id)
            self._outstanding[worker_id] = indexes
            self.record.claim(worker_id, len(indexes), ok=False, reason=reason)
            preempt = self.order.preempt if self._preempting else 0
            return [SendClaim(worker_id, indexes, self.record.share(worker_id), preempt=preempt)]
        self.record.claim(worker_id, len(indexes), ok=False, reason=reason)
        self._unknown[worker_id] = indexes
        self._silent += 1
        self._dropped.add(worker_id)
        self._heap = [s for s in self._heap if s.offer.worker.id != worker_id]
        heapq.heapify(self._heap)
        return self._next(now)

    # -- the steps -------------------------------------------------------------------------

    def _next(self, now: float) -> list[Action]:
        """Claim what is pending, once every claim sent is answered; or finish."""
        if self._outstanding:
            return []  # a round ends when all its claims are answered
        if not self._pending or self.order.purpose is Purpose.EXPLAIN:
            return [self._end(now)]
        if self._placed_before == len(self._placed) and self.record.rounds:
            self._futile += 1
        else:
            self._futile = 0
        if self._silent >= self._rules.max_silent or self._futile >= self._max_rounds():
            return [self._finish(now)]
        groups = self._assign(self._pending)
        if not groups:
            more = self._more(now)
            if more is not None:
                return more
            return [self._end(now)]
        self._placed_before = len(self._placed)
        self.record.claiming(now)
        actions: list[Action] = []
        preempt = self.order.preempt if self._preempting else 0
        for worker_id, indexes in groups.items():
            self._outstanding[worker_id] = tuple(indexes)
            share = self.record.share(worker_id)
            actions.append(SendClaim(worker_id, tuple(indexes), share, preempt=preempt))
        assigned = {i for indexes in groups.values() for i in indexes}
        self._pending = [i for i in self._pending if i not in assigned]
        return actions

    def _max_rounds(self) -> int:
        # One machine goes down its whole ranking (each refusal costs one round trip, and
        # giving up while a worker that answered has room would waste capacity); a batch
        # goes on while its rounds place machines, and stops after max_rounds in a row that
        # placed none (each refusal also corrects the book, so the next draw is better).
        return 1_000_000 if not self.order.batch else self._rules.max_rounds

    def _more(self, now: float) -> list[Action] | None:
        """The ranking ran out: draw more candidates from the book, or ask for offers once."""
        if self.record.source == _Source.BOOK and self._refills < 2 and self._draw(now):
            self._refills += 1
            return self._next(now)
        if (
            not self._asked_offers
            and self._rules.use_book
            and self.order.purpose is not (Purpose.EXPLAIN)
        ):
            return [self._ask_offers(preempt=self._preempting)]
        return None

    def _draw(self, now: float) -> bool:
        """Candidates from the book into the ranking; False when none has room."""
        order, rules = self.order, self._rules
        slots = math.ceil(rules.factor_d * len(self._pending)) if order.batch else 1
        found = self._book.candidates(
            order.region,
            order.request.app,
            self._want,
            seed=f"{order.request_id}:{self._refills}",
            wanted=rules.candidates,
            slots=slots,
            exclude=self._seen,
            alive=self._alive,
            max_draw=rules.max_draw,
            image=order.request.image,
            pinned=order.request.volume_worker,
            displace=self._displace if self._preempting else (),
        )
        if not found.feasible:
            return False
        self.record.drew(len(found.offers), found.population, now)
        self._rank(found.offers, now)
        return True

    def _end(self, now: float) -> Action:
        """Finish; or, when the machine fits nowhere and may displace others, ask again for
        offers that say whom each worker would displace."""
        order = self.order
        short = not self._heap if order.purpose is Purpose.EXPLAIN else len(self._placed) < 1
        if not short or not self._short_of_room or not self._may_preempt():
            return self._finish(now)
        return self._preempt("no worker had room for it as it is")

    def _may_preempt(self) -> bool:
        """Whether the order may still look at displacing machines."""
        order = self.order
        return not (
            self._preempting
            or order.preempt <= 0
            or order.batch
            or order.purpose is Purpose.HOLD
            or self._unknown
            or self._existing is not None
            or RANK[order.priority_class] <= RANK["spot"]
        )

    def _preempt(self, reason: str) -> AskOffers:
        """Ask for offers that say whom each worker would displace."""
        self._begin_preempting(reason)
        return self._ask_offers(preempt=True)

    def _begin_preempting(self, reason: str) -> None:
        """From here on, workers are ranked as they would stand once lower classes gave their
        room back, and claims may displace; the candidates and claims so far are forgotten
        (but unanswered ones: their machines may have been made)."""
        order = self.order
        self._preempting = True
        self._dropped -= {w for w in self._dropped if w not in self._asked_again}
        self._pending = list(range(order.count))
        self._heap, self._seen = [], set()
        self.record.restart()
        self.record.preempting(
            Preemption(
                priority_class=order.priority_class,
                displaces=list(self._displace),
                max_victims=order.preempt,
                reason=reason,
            )
        )

    def _ask_offers(self, *, preempt: bool = False) -> AskOffers:
        self._asked_offers = True
        order, rules = self.order, self._rules
        if self._seen:
            # Fresh offers supersede what the book said: rank them anew (the claims tried so
            # far stay in the record, and a worker that refused stays out).
            self._heap, self._seen = [], set()
            self.record.restart()
        asking = [w for w in self._up if w not in self._dropped]
        plan = plan_sample(
            order.request_id,
            asking,
            machines=order.count,
            above=rules.sample_above,
            factor_d=rules.factor_d,
            minimum=rules.sample_min,
        )
        if plan.workers is None:
            live = self._live()
            self.record.asking(None, live)
            return AskOffers(None, expect=live or None, preempt=preempt)
        workers = self._with_holders(plan.workers, asking)
        self.record.asking(workers, plan.population)
        return AskOffers(tuple(workers), expect=len(workers), preempt=preempt)

    def _with_holders(self, sample: list[str], asking: list[str]) -> list[str]:
        """A sample for a machine of an image asks the workers that cache it too (as many as
        the candidates wanted), and one that mounts a volume the volume's worker, so that
        sampling never misses them."""
        image, pinned = self.order.request.image, self.order.request.volume_worker
        if pinned is not None and pinned not in sample and pinned in asking:
            sample = [pinned, *sample]  # the worker of the volume it mounts is always asked
        if image is None:
            return sample
        up, taken = set(asking), set(sample)
        holders = [w for w in self._book.holders(image.reference) if w in up and w not in taken]
        return [*holders[: self._rules.candidates], *sample]

    def _rank(self, offers: Sequence[Offer], now: float) -> None:
        fresh = [o for o in offers if o.worker.id not in self._seen]
        self._seen.update(o.worker.id for o in fresh)
        evictions: dict[str, tuple[int, int, int, float, int]] = {}
        if self._preempting:
            fresh = [_as_if_evicted(o) for o in fresh]
            for o in fresh:
                if o.eviction is not None:
                    evictions[o.worker.id] = o.eviction.key()
        ranking = self._pipeline.rank(self.order.request, fresh)
        # How many each would displace, as the worker said (the book's guess is not recorded).
        preempts = (
            {
                o.worker.id: o.eviction.victims
                for o in fresh
                if o.eviction is not None and not o.eviction.estimated
            }
            if self._preempting
            else None
        )
        self.record.ranked(ranking, now, preempts=preempts)
        self._short_of_room |= any(_for_room(o.rejected) for o in ranking.outcomes)
        scores = {o.worker_id: o for o in ranking.outcomes if o.score is not None}
        for i, offer in enumerate(ranking.ordered):
            if offer.worker.id in self._dropped:
                continue
            score = scores[offer.worker.id].score or 0.0
            first = evictions.get(offer.worker.id, _NO_EVICTION)
            key: _Key = (*first, -score, self._ranked_base + i)
            heapq.heappush(self._heap, _Slot(key, offer))
        self._ranked_base += len(ranking.ordered)

    def _assign(self, pending: Sequence[int]) -> dict[str, list[int]]:
        """Give each pending machine to the best worker. A batch charges the worker's offer with
        each machine and scores it again (best-fit fills a worker, then moves on); a single
        machine, or one per worker (``distinct_workers_for``), takes the worker out."""
        groups: dict[str, list[int]] = {}
        request = self.order.request
        refill = self.order.batch and request.distinct_workers_for is None
        for index in pending:
            if not self._heap:
                break
            slot = heapq.heappop(self._heap)
            groups.setdefault(slot.offer.worker.id, []).append(index)
            if not refill:
                continue
            charged = _charge(slot.offer, self._want)
            again = self._pipeline.rank(request, [charged])
            if again.ordered:
                score = next(o.score for o in again.outcomes if o.score is not None)
                key: _Key = (*_NO_EVICTION, -(score or 0.0), slot.key[6])
                heapq.heappush(self._heap, _Slot(key, charged))
        return groups

    def _finish(self, now: float, *, error: SouqError | None = None) -> Finished:
        placed = dict(sorted(self._placed.items()))
        best = self._heap[0].offer.worker.id if self._heap else None
        record = self.record.final(placed, now, best=best)
        short = (
            not self._heap
            if self.order.purpose is Purpose.EXPLAIN
            else len(placed) < self.order.min_count
        )
        if error is None and short and self._unknown:
            error = self._unanswered()
        if error is None and short:
            error = self.record.shortfall(placed, now)
        return Finished(placed=placed, record=record, error=error)

    def _unanswered(self) -> SouqError:
        workers = sorted(self._unknown)
        count = sum(len(indexes) for indexes in self._unknown.values())
        return Unavailable(
            f"{count} claim(s) went unanswered twice by {', '.join(workers)}: the machine(s) may"
            " have been made there",
            hint="retry with the same Idempotency-Key (it finds a machine already made), or"
            " list the app's machines",
            details={"unanswered_workers": workers},
        )

    def _used_key(self, existing: Offer) -> SouqError:
        return IdempotencyConflict(
            f"request {self.order.request_id} already made machine {existing.existing_machine_id}",
            hint="a dry run with a used idempotency key would place nothing",
            details={"machine_id": existing.existing_machine_id},
        )


def _for_room(reason: str | None) -> bool:
    """Whether a refusal or rejection is for want of room (cpu, memory, disk, GPUs; a refusal
    that names no reason: its status)."""
    return reason in SHORT_OF_ROOM or reason == InsufficientCapacity.status


def _as_if_evicted(offer: Offer) -> Offer:
    """A preempting create's offer as the worker would stand once its victims were gone (what
    the pipeline filters and scores); an offer that displaces nobody as it is."""
    eviction = offer.eviction
    if eviction is None or eviction.victims == 0:
        return offer
    worker = offer.worker.model_copy(
        update={
            "allocated": offer.worker.allocated.minus(eviction.freed),
            "gpu_free": list(eviction.gpu_free) or offer.worker.gpu_free,
        }
    )
    return offer.model_copy(update={"worker": worker, "eligible": True})


def _charge(offer: Offer, want: Resources) -> Offer:
    """The offer as it would stand with one more machine of ``want`` on the worker."""
    worker = offer.worker.model_copy(update={"allocated": offer.worker.allocated.plus(want)})
    return offer.model_copy(update={"worker": worker})
