"""Batch creates: ``count`` machines of one config in one call (Sparrow's batch sampling).

One HTTP request, one request for offers and one claim per chosen worker, instead of ``count``
of each: this is what lets one broker place thousands of machines a second. Phases:

1. **solicit** — ask the region's workers for offers: everyone at or below ``sample_above`` up
   workers, else a seeded random sample of ``max(sample_min, d x count)``
   (:mod:`souq.broker.sampling`);
2. **rank** — run the placement pipeline once, for one machine of the config;
3. **assign** — greedily, machine by machine: each goes to the best-scored worker, whose offer is
   then charged with it and re-scored (so best-fit fills a worker to a comfortable level, then
   moves on; ``distinct_workers_for`` allows one per worker). When the offers run out and the
   region was sampled, ask a fresh sample of workers not asked yet;
4. **claim** — one ``claim_batch`` per worker, all at once; each is atomic on its worker (all of
   its machines fit or none is made). An unanswered claim is sent once more to the same worker
   (idempotent per request id). A refused or silent worker's machines are re-assigned to the
   others, for at most ``max_claim_attempts`` rounds.

Immediate-or-cancel: if fewer than ``min_count`` machines were placed (default: all of them),
the ones made are destroyed again and the call raises :class:`InsufficientCapacity` with the
batch's record; otherwise it answers with what it placed and why the rest could not be.

A batch takes no ``Idempotency-Key`` (yet): its machines' request ids are derived from the
batch's, but a retry could assign them to other workers than the first attempt did.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from souq.broker.config import BrokerConfig
from souq.broker.directory import Directory
from souq.broker.liveness import Liveness
from souq.broker.sampling import plan_sample
from souq.clock import Clock
from souq.errors import (
    ClaimRefused,
    InsufficientCapacity,
    InvalidInput,
    SouqError,
    Unavailable,
    UnknownRegion,
)
from souq.model import (
    ClaimAttempt,
    DestroyCommand,
    Machine,
    Offer,
    OfferOutcome,
    OfferRequest,
    Placement,
    Resources,
    Timings,
    WorkerInfo,
)
from souq.model.batch import (
    BatchClaim,
    BatchClaimRequest,
    BatchCreateRequest,
    BatchPlacement,
    BatchResult,
)
from souq.model.placement import Sampling
from souq.placement import Pipeline, PipelineCache, PlacementRequest
from souq.protocol import WorkerClient
from souq.protocol.verbs import CLAIM_BATCH, DESTROY, OFFER

__all__ = ["BatchPlacer"]

log = logging.getLogger(__name__)

RECORD_OFFERS = 50  # offers listed in a batch's record (the counts cover all of them)
SLOT_PEEK = 16  # workers whose last heartbeat estimates how many machines a worker takes
SLOT_CAP = 1_000_000
CLAIM_S_PER_MACHINE = 0.01  # a batch claim's deadline grows by this per machine it carries


@dataclass(order=True)
class _Slot:
    """A worker in the assignment heap: best score first, then the initial ranking's order."""

    key: tuple[float, int]
    offer: Offer = field(compare=False)
    outcome: OfferOutcome = field(compare=False)


@dataclass
class _Book:
    """The batch's working state."""

    request_id: str
    body: BatchCreateRequest
    request: PlacementRequest
    heap: list[_Slot] = field(default_factory=list)
    asked: set[str] = field(default_factory=set)
    population: list[str] = field(default_factory=list)  # up workers not asked yet
    region_size: int = 0  # up workers of the region
    expected: int = 0
    received: int = 0
    sampled: bool = False
    rejections: Counter[str] = field(default_factory=Counter)
    outcomes: list[OfferOutcome] = field(default_factory=list)
    runner_up: dict[str, str | None] = field(default_factory=dict)
    placed: dict[int, Machine] = field(default_factory=dict)
    claims: list[BatchClaim] = field(default_factory=list)
    solicits: int = 0


class BatchPlacer:
    def __init__(
        self,
        workers: WorkerClient,
        liveness: Liveness,
        directory: Directory,
        config: BrokerConfig,
        clock: Clock,
        *,
        pipeline: Pipeline | None = None,
    ) -> None:
        self._workers = workers
        self._liveness = liveness
        self._directory = directory
        self._config = config
        self._clock = clock
        # The broker's configured default policy (a batch names no policy of its own yet).
        self._pipeline = pipeline or PipelineCache(config.placement).default
        self._turns = asyncio.Semaphore(config.batch_concurrency)

    async def place(
        self, app: str, body: BatchCreateRequest, *, request_id: str, body_hash: str
    ) -> BatchResult:
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
            return await self._place(
                app, body, request_id=request_id, body_hash=body_hash, min_count=min_count
            )
        finally:
            self._turns.release()

    async def _place(
        self,
        app: str,
        body: BatchCreateRequest,
        *,
        request_id: str,
        body_hash: str,
        min_count: int,
    ) -> BatchResult:
        count = body.count
        started = self._clock.monotonic()
        book = _Book(
            request_id=request_id,
            body=body,
            request=PlacementRequest.for_machine(request_id, app, body.region, body.config),
        )
        book.population = self._liveness.up_workers(body.region)
        book.region_size = len(book.population)
        await self._solicit(book, app, count, seed=request_id)
        gathered = self._clock.monotonic()
        if book.received == 0:
            raise self._nobody(body.region)

        pending = list(range(count))
        rounds = 0
        while pending and rounds < self._config.max_claim_attempts:
            rounds += 1
            groups = self._assign(book, pending)
            assigned = {i for indexes in groups.values() for i in indexes}
            rest = [i for i in pending if i not in assigned]
            if rest and await self._more(book, app, len(rest)):
                for worker_id, indexes in self._assign(book, rest).items():
                    groups.setdefault(worker_id, []).extend(indexes)
            if not groups:
                break
            record = self._record(book, min_count, rounds, started, gathered)
            await self._claim(book, app, body_hash, groups, record)
            pending = [i for i in range(count) if i not in book.placed]

        record = self._record(book, min_count, rounds, started, gathered)
        machines = [book.placed[i] for i in sorted(book.placed)]
        for machine in machines:
            self._directory.remember(machine.id, machine.worker_id)
        reasons = _reasons(book, count)
        if len(machines) < min_count:
            await self._undo(app, machines)
            raise InsufficientCapacity(
                f"placed {len(machines)} of {count} machines in region {body.region}, fewer "
                f"than min_count {min_count} (the {len(machines)} made were destroyed): "
                f"{', '.join(reasons) or 'no offers'}",
                hint="ask for fewer machines, lower min_count, free capacity or add workers",
                details={"placement": record.model_dump(mode="json")},
            )
        return BatchResult(
            requested=count,
            placed=len(machines),
            machines=machines,
            unplaced=reasons if len(machines) < count else [],
            placement=record,
        )

    # -- solicit ---------------------------------------------------------------------------

    async def _solicit(self, book: _Book, app: str, machines: int, *, seed: str) -> None:
        body, config = book.body, self._config
        ask = OfferRequest(
            request_id=book.request_id,
            app=app,
            region=body.region,
            resources=body.config.guest.resources(),
        )
        plan = plan_sample(
            seed,
            book.population,
            machines=machines,
            slots=self._slots(book, seed),
            above=config.sample_above,
            factor_d=config.sample_factor_d,
            minimum=config.sample_min,
        )
        if plan.workers is None:
            expected = self._liveness.live_count(body.region)
            offers = await self._workers.ask_region(
                body.region, ask, expect=expected or None, timeout=config.batch_offer_timeout_s
            )
        else:
            book.sampled = True
            expected = len(plan.workers)
            offers = await self._workers.call_each(
                plan.workers, OFFER, ask, timeout=config.batch_offer_timeout_s
            )
            book.asked.update(plan.workers)
        book.solicits += 1
        book.expected += expected
        book.received += len(offers)
        self._rank(book, offers)

    def _slots(self, book: _Book, seed: str) -> int:
        """How many machines of the batch a worker can typically take: the median over a few
        workers of what their last heartbeats left free (a stale but cheap estimate; a short
        sample is topped up by :meth:`_more`)."""
        want = book.request.resources
        peek = random.Random(seed).sample(book.population, min(SLOT_PEEK, len(book.population)))
        fits = []
        for worker_id in peek:
            info = self._liveness.info(worker_id)
            if info is None:
                continue
            free = info.capacity.minus(info.allocated)
            fits.append(
                min(
                    free.millicpus // want.millicpus if want.millicpus else SLOT_CAP,
                    free.memory_mb // want.memory_mb if want.memory_mb else SLOT_CAP,
                )
            )
        if not fits:
            return 1
        return max(1, min(SLOT_CAP, sorted(fits)[len(fits) // 2]))

    async def _more(self, book: _Book, app: str, machines: int) -> bool:
        """Ask a fresh sample of the workers not asked yet; False when there is nobody left."""
        if not book.sampled:
            return False
        rest = [w for w in book.population if w not in book.asked]
        if not rest:
            return False
        book.population = rest
        await self._solicit(book, app, machines, seed=f"{book.request_id}:{book.solicits}")
        return True

    def _rank(self, book: _Book, offers: Sequence[Offer]) -> None:
        ranking = self._pipeline.rank(book.request, offers)
        for reason, n in ranking.rejections.items():
            book.rejections[reason] += n
        scores = {o.worker_id: o for o in ranking.outcomes if o.score is not None}
        base = len(book.outcomes)
        book.outcomes.extend(ranking.outcomes)
        ordered = ranking.ordered
        for i, offer in enumerate(ordered):
            outcome = scores[offer.worker.id]
            book.runner_up[offer.worker.id] = (
                ordered[i + 1].worker.id if i + 1 < len(ordered) else None
            )
            heapq.heappush(book.heap, _Slot((-(outcome.score or 0.0), base + i), offer, outcome))

    # -- assign ----------------------------------------------------------------------------

    def _assign(self, book: _Book, pending: Sequence[int]) -> dict[str, list[int]]:
        """Give each pending machine to the best worker, charging its offer as it goes."""
        groups: dict[str, list[int]] = {}
        want = book.request.resources
        one_each = book.request.distinct_workers_for is not None
        for index in pending:
            if not book.heap:
                break
            slot = heapq.heappop(book.heap)
            worker_id = slot.offer.worker.id
            groups.setdefault(worker_id, []).append(index)
            if one_each:
                continue
            charged = _charge(slot.offer, want)
            again = self._pipeline.rank(book.request, [charged])
            if again.ordered:
                score = next(o.score for o in again.outcomes if o.score is not None)
                heapq.heappush(
                    book.heap, _Slot((-(score or 0.0), slot.key[1]), charged, again.outcomes[0])
                )
        return groups

    # -- claim -----------------------------------------------------------------------------

    async def _claim(
        self,
        book: _Book,
        app: str,
        body_hash: str,
        groups: dict[str, list[int]],
        record: BatchPlacement,
    ) -> None:
        body = book.body

        async def one(worker_id: str, indexes: list[int]) -> None:
            share = Placement(
                request_id=book.request_id,
                region=body.region,
                policy=record.policy,
                expected_offers=record.expected_offers,
                offers_received=record.offers_received,
                rejections=record.rejections,
                offers=[o for o in record.offers if o.worker_id == worker_id][:1],
                winner=worker_id,
                runner_up=book.runner_up.get(worker_id),
                claims=[ClaimAttempt(worker_id=worker_id, ok=True)],
                timings=record.timings,
                sampled=record.sampled,
            )
            claim = BatchClaimRequest(
                request_id=book.request_id,
                body_hash=body_hash,
                app=app,
                region=body.region,
                config=body.config,
                skip_launch=body.skip_launch,
                request_ids=[f"{book.request_id}-{i}" for i in indexes],
                placement=share,
            )
            # A worker makes each machine in turn: allow time per machine. A claim that goes
            # unanswered is sent once more to the same worker (it is idempotent per request
            # id), so that a slow worker's late success is collected, not duplicated elsewhere.
            timeout = self._config.claim_timeout_s + CLAIM_S_PER_MACHINE * len(indexes)
            try:
                try:
                    reply = await self._workers.call(worker_id, CLAIM_BATCH, claim, timeout=timeout)
                except Unavailable:
                    if not self._workers.connected:
                        raise
                    reply = await self._workers.call(worker_id, CLAIM_BATCH, claim, timeout=timeout)
                machines = reply.machines
            except (ClaimRefused, Unavailable) as exc:
                log.info("batch claim of %d on %s failed: %s", len(indexes), worker_id, exc)
                book.claims.append(
                    BatchClaim(worker_id=worker_id, count=len(indexes), ok=False, reason=exc.status)
                )
                _drop(book, worker_id)  # its offer is stale: re-assign its machines elsewhere
                return
            book.claims.append(BatchClaim(worker_id=worker_id, count=len(indexes), ok=True))
            for index, machine in zip(indexes, machines, strict=True):
                book.placed[index] = machine

        await asyncio.gather(*(one(w, idx) for w, idx in groups.items()))

    async def _undo(self, app: str, machines: Sequence[Machine]) -> None:
        """Destroy machines of a batch that fell short of its ``min_count``."""

        async def destroy(machine: Machine) -> None:
            cmd = DestroyCommand(app=app, machine_id=machine.id, force=True)
            try:
                await self._workers.call(
                    machine.worker_id, DESTROY, cmd, timeout=self._config.command_timeout_s
                )
            except SouqError as exc:
                log.warning("could not destroy %s of a failed batch: %s", machine.id, exc)

        await asyncio.gather(*(destroy(m) for m in machines))

    # -- record ----------------------------------------------------------------------------

    def _record(
        self, book: _Book, min_count: int, rounds: int, started: float, gathered: float
    ) -> BatchPlacement:
        now = self._clock.monotonic()
        assignments = Counter(m.worker_id for m in book.placed.values())
        scored = sorted(
            (o for o in book.outcomes if o.score is not None), key=lambda o: -(o.score or 0.0)
        )
        return BatchPlacement(
            request_id=book.request_id,
            region=book.body.region,
            policy=self._pipeline.name,
            requested=book.body.count,
            min_count=min_count,
            placed=len(book.placed),
            expected_offers=book.expected,
            offers_received=book.received,
            sampled=Sampling(asked=len(book.asked), of=book.region_size, seed=book.request_id)
            if book.sampled
            else None,
            rejections=dict(book.rejections),
            offers=scored[:RECORD_OFFERS],
            assignments=dict(assignments),
            claims=list(book.claims),
            rounds=rounds,
            timings=Timings(
                gather_ms=_ms(gathered - started),
                claim_ms=_ms(now - gathered),
                total_ms=_ms(now - started),
            ),
        )

    def _nobody(self, region: str) -> SouqError:
        if not self._liveness.knows_region(region):
            known = self._liveness.regions()
            return UnknownRegion(
                f"region {region!r} is unknown"
                + (f"; known regions: {', '.join(known)}" if known else ""),
                hint="pick one of the known regions",
            )
        return InsufficientCapacity(
            f"no worker in region {region} answered within {self._config.batch_offer_timeout_s:g}s",
            hint="check `souq workers`, or try another region",
        )


def _charge(offer: Offer, want: Resources) -> Offer:
    """The offer as it would stand with one more machine of ``want`` on the worker."""
    worker: WorkerInfo = offer.worker
    charged = worker.model_copy(update={"allocated": worker.allocated.plus(want)})
    return offer.model_copy(update={"worker": charged})


def _drop(book: _Book, worker_id: str) -> None:
    book.heap = [s for s in book.heap if s.offer.worker.id != worker_id]
    heapq.heapify(book.heap)


def _reasons(book: _Book, count: int) -> list[str]:
    reasons = [f"{n} offers {reason}" for reason, n in sorted(book.rejections.items())]
    refused = [c for c in book.claims if not c.ok]
    if refused:
        reasons.append(f"{len(refused)} batch claims refused ({sum(c.count for c in refused)})")
    if book.sampled:
        reasons.append(f"asked a sample of {len(book.asked)} workers")
    silent = book.expected - book.received
    if silent > 0:
        reasons.append(f"{silent} did not answer")
    if len(book.placed) < count:
        reasons.insert(0, f"{count - len(book.placed)} of {count} not placed")
    return reasons


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
