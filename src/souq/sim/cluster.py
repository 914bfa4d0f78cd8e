"""A whole cluster in one process on virtual time: brokers and workers running the real cores.

Pure and deterministic. Each broker is a :class:`~souq.market.WorkerBook` and the
:class:`~souq.market.Auction` s it runs; each worker is an
:class:`~souq.agent.capacity.admission.Admission`, the worker's own admission core. Messages between
them are timers on a :class:`~souq.clock.VirtualClock` (``hop_s`` each way), so that races happen as
they would on a network: two brokers may send claims for the last capacity at the same time, and the
worker judges them in the order they arrive. Workers tell every broker their usage after each
change, as agents do on ``souq.use.<region>.<worker>``.

When a broker's book has no candidate with room, it asks the workers for offers, as a real
broker does: each asked worker answers after a round trip (two hops) with its admission's
verdict, so that a refused create's record counts the reasons of real offers. A sampling broker
(past ``Rules.sample_above`` up workers) asks a seeded sample of the region.

Priority classes (:mod:`souq.market.preemption`): a create carries its class and bid; when it
may displace (``preempt``: at most that many machines, as the broker's
``preempt_max_victims``) and fits nowhere, the auction asks for offers again, each worker
answering with the eviction its admission plans (``Admission.plan_preemption``, the broker's and
the agent's chooser), and the chosen worker judges the claim again on its ledger
(``Admission.check_preempting_claim``), gives the victims' reservations back and tells
``on_preempted`` (an :class:`Evicted` each) before it records the new machine.

What it leaves out: processes (a machine is its reservation), heartbeats (the book is filled at
start and kept by usage messages) and the app's machines per worker (the book counts only what
its caller tells it with ``book.placed``). The simulator and the tests of the market core stand
on it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from souq.agent.capacity.admission import Admission
from souq.clock import VirtualClock
from souq.errors import ClaimRefused, SouqError
from souq.market import AskOffers, Auction, Finished, Order, Purpose, Rules, SendClaim, WorkerBook
from souq.market.preemption import Candidate, Eviction, may_displace
from souq.model.choices import PriorityClass
from souq.model.constraint import Constraint
from souq.model.protocol import Offer
from souq.model.reasons import Reason
from souq.model.resources import Resources
from souq.model.worker import Fingerprint, Load, WorkerInfo, WorkerState, WorkerUsage
from souq.placement import Pipeline, PlacementRequest, default_pipeline

__all__ = ["Evicted", "Placed", "SimBroker", "SimMachine", "SimWorker", "VirtualCluster"]


@dataclass
class SimWorker:
    """A worker: its admission core and the machines it holds."""

    id: str
    region: str
    admission: Admission
    labels: dict[str, str] = field(default_factory=dict)
    machines: dict[str, Resources] = field(default_factory=dict)
    gpu_ids: dict[str, tuple[int, ...]] = field(default_factory=dict)  # machines' GPUs
    fingerprint: Fingerprint | None = None  # what constraints on fingerprint.* read
    load: Load | None = None  # the host's measured load, as its heartbeats would tell it
    # Each machine as a victim would be (its class, bid, reservation, GPUs, when it came).
    victims: dict[str, Candidate] = field(default_factory=dict)

    def candidates(self, claimant: str) -> list[Candidate]:
        """The machines here that one of class ``claimant`` could displace."""
        return [c for c in self.victims.values() if may_displace(claimant, c.priority_class)]

    @property
    def state(self) -> WorkerState:
        """As the agent reports it: draining, cordoned or up (its admission's flags)."""
        a = self.admission
        if a.draining:
            return WorkerState.DRAINING
        return WorkerState.CORDONED if a.cordoned else WorkerState.UP

    def info(self, now_ms: int) -> WorkerInfo:
        a = self.admission
        return WorkerInfo(
            id=self.id,
            region=self.region,
            state=self.state,
            capacity=a.capacity,
            allocated=a.in_use(now_ms),
            labels=self.labels,
            fingerprint=self.fingerprint,
            machines=len(self.machines),
            version=a.version,
            load=self.load,
            gpu_free=list(a.gpu_free(now_ms)),
            gpu_shapes=a.gpu_shapes(),
        )

    def offer(
        self, want: Resources, now_ms: int, *, claimant: str | None = None, max_victims: int = 0
    ) -> Offer:
        """Its answer to a request for offers, as the agent makes it: the admission's verdict;
        for a create that may displace (``claimant``'s class, ``max_victims``) and does not
        fit as it is, whom the worker would displace."""
        refusal = self.admission.offer_refusal(want, now_ms)
        eviction = None
        if refusal is not None and refusal[0] is not Reason.CORDONED and claimant and max_victims:
            plan = self.admission.plan_preemption(
                want,
                now_ms,
                claimant=claimant,
                max_victims=max_victims,
                candidates=self.candidates(claimant),
            )
            if plan is not None:
                eviction, refusal = plan.offered(), None
            else:
                refusal = (refusal[0], f"{refusal[1]}, and displacing machines would not do")
        return Offer(
            worker=self.info(now_ms),
            eligible=refusal is None,
            reason=None if refusal is None else refusal[0],
            detail=None if refusal is None else refusal[1],
            load=self.load,
            eviction=eviction,
        )


@dataclass
class SimBroker:
    id: str
    book: WorkerBook = field(default_factory=WorkerBook)


@dataclass(frozen=True)
class SimMachine:
    id: str
    worker_id: str


@dataclass(frozen=True)
class Evicted:
    """A machine displaced on ``worker_id`` at ``at`` (virtual seconds) to make room for ``by``."""

    worker_id: str
    machine_id: str
    by: str
    at: float


@dataclass(frozen=True)
class Placed:
    """How one create ended: the machines' workers (by index), its record, its error, and when
    it started and ended on the virtual clock; ``machines``: the machines' ids (by index)."""

    workers: dict[int, str]
    record: Any
    error: SouqError | None
    started: float
    finished: float
    machines: dict[int, str] = field(default_factory=dict)


class VirtualCluster:
    def __init__(
        self,
        *,
        clock: VirtualClock | None = None,
        pipeline: Pipeline | None = None,
        rules: Rules | None = None,
        hop_s: float = 0.0005,
    ) -> None:
        self.clock = clock or VirtualClock()
        self.pipeline = pipeline or default_pipeline()
        self.rules = rules or Rules()
        self.hop_s = hop_s
        self.workers: dict[str, SimWorker] = {}
        self.brokers: list[SimBroker] = []
        self._ids = itertools.count(1)
        self._up: dict[str, list[str]] = {}  # region -> its up workers, sorted (made when asked)
        self._bids: dict[str, float | None] = {}  # a create's max_price, by its request id
        self.on_preempted: Callable[[Evicted], None] | None = None

    # -- the cluster -----------------------------------------------------------------------

    def add_broker(self) -> SimBroker:
        broker = SimBroker(f"b{len(self.brokers) + 1}")
        now = self.clock.now_ms()
        for worker in self.workers.values():
            broker.book.observe(worker.info(now))
        self.brokers.append(broker)
        return broker

    def add_worker(
        self,
        region: str,
        capacity: Resources,
        *,
        labels: dict[str, str] | None = None,
        worker_id: str | None = None,
    ) -> SimWorker:
        """A worker (``w00001``, ``w00002`` ... unless ``worker_id`` names it), empty."""
        worker_id = worker_id or f"w{len(self.workers) + 1:05d}"
        worker = SimWorker(
            worker_id,
            region,
            Admission(worker_id=worker_id, region=region, capacity=capacity),
            labels=dict(labels or {}),
        )
        self.workers[worker_id] = worker
        self._up.pop(region, None)
        now = self.clock.now_ms()
        for broker in self.brokers:
            broker.book.observe(worker.info(now))
        return worker

    def set_flags(self, worker_id: str, *, cordoned: bool, draining: bool = False) -> None:
        """Cordon (or drain) a worker, or open it again; the brokers hear it one hop later."""
        worker = self.workers[worker_id]
        worker.admission.set_flags(cordoned=cordoned or draining, draining=draining)
        self._up.pop(worker.region, None)
        self._tell_usage(worker)

    def allocated(self, worker_id: str) -> Resources:
        return self.workers[worker_id].admission.reserved

    def up_workers(self, region: str) -> list[str]:
        """The region's up workers, sorted: whom a sampling broker asks for offers."""
        ids = self._up.get(region)
        if ids is None:
            ids = self._up[region] = sorted(
                w.id
                for w in self.workers.values()
                if w.region == region and w.state is WorkerState.UP
            )
        return ids

    # -- creates ---------------------------------------------------------------------------

    def create(
        self,
        broker: SimBroker,
        *,
        app: str,
        region: str,
        resources: Resources,
        count: int = 1,
        min_count: int | None = None,
        constraints: tuple[Constraint, ...] = (),
        distinct_workers_for: str | None = None,
        request_id: str | None = None,
        purpose: Purpose = Purpose.CLAIM,
        on_done: Callable[[Placed], None] | None = None,
        priority_class: str = PriorityClass.STANDARD,
        max_price: float | None = None,
        preempt: int = 0,
    ) -> None:
        """Start a create on ``broker`` now; ``on_done`` is called when it ends (in virtual
        time: run the clock). ``purpose=Purpose.EXPLAIN`` is a dry run: the record, no claim.
        ``request_id`` seeds the draws and ties (default: the next of a counter). Its
        ``priority_class`` and bid (``max_price``); fitting nowhere, it may displace at most
        ``preempt`` machines of a lower class (0: none)."""
        request = PlacementRequest(
            request_id=request_id or f"r{next(self._ids):08d}",
            app=app,
            region=region,
            resources=resources,
            constraints=constraints,
            distinct_workers_for=distinct_workers_for,
        )
        order = Order(
            request,
            count=count,
            min_count=count if min_count is None else min_count,
            purpose=purpose,
            batch=count > 1,
            preempt=preempt,
            priority_class=priority_class,
        )
        self._bids[request.request_id] = max_price
        started = self.clock.monotonic()
        auction = Auction(
            order,
            pipeline=self.pipeline,
            book=broker.book,
            rules=self.rules,
            now=started,
            up_workers=self.up_workers(region),
            live=lambda: sum(1 for w in self.workers.values() if w.region == region),
        )

        def finish(done: Finished) -> None:
            self._bids.pop(request.request_id, None)
            if on_done is not None:
                workers = {i: m.worker_id for i, m in done.placed.items()}
                machines = {i: m.id for i, m in done.placed.items()}
                ended = self.clock.monotonic()
                on_done(Placed(workers, done.record, done.error, started, ended, machines))

        self._perform(broker, auction, auction.start(started), finish)

    def place(self, broker: SimBroker, **create: Any) -> Placed:
        """One create, run to its end on virtual time."""
        ended: list[Placed] = []
        self.create(broker, on_done=ended.append, **create)
        self.clock.run()
        (placed,) = ended
        return placed

    def destroy(self, worker_id: str, machine_id: str) -> None:
        worker = self.workers[worker_id]
        freed = worker.machines.pop(machine_id)
        worker.victims.pop(machine_id, None)
        worker.admission.release(freed, worker.gpu_ids.pop(machine_id, ()))
        self._tell_usage(worker)

    def holds(self, worker_id: str, machine_id: str) -> bool:
        """Whether the machine is still on the worker (not destroyed, not displaced)."""
        return machine_id in self.workers[worker_id].machines

    # -- messages --------------------------------------------------------------------------

    def _perform(
        self,
        broker: SimBroker,
        auction: Auction,
        actions: list[Any],
        finish: Callable[[Finished], None],
    ) -> None:
        for action in actions:
            if isinstance(action, Finished):
                finish(action)
            elif isinstance(action, AskOffers):
                answer = partial(self._answer, broker, auction, action, finish)
                self.clock.call_later(2 * self.hop_s, answer)
            elif isinstance(action, SendClaim):
                claim = partial(self._claim, broker, auction, action, finish)
                self.clock.call_later(self.hop_s, claim)

    def _answer(
        self,
        broker: SimBroker,
        auction: Auction,
        action: AskOffers,
        finish: Callable[[Finished], None],
    ) -> None:
        """The offers of the workers asked (the region's live ones when none are named), once
        the request and the answers have travelled."""
        region = auction.order.region
        if action.workers is None:
            asked = [w for w in self.workers.values() if w.region == region]
        else:
            asked = [self.workers[w] for w in action.workers if w in self.workers]
        order = auction.order
        want, now_ms = order.request.resources, self.clock.now_ms()
        claimant = order.priority_class if action.preempt else None
        offers = [
            w.offer(want, now_ms, claimant=claimant, max_victims=order.preempt) for w in asked
        ]
        self._perform(broker, auction, auction.offers(offers, self.clock.monotonic()), finish)

    def _claim(
        self,
        broker: SimBroker,
        auction: Auction,
        action: SendClaim,
        finish: Callable[[Finished], None],
    ) -> None:
        """The worker judges the claim on arrival; its answer travels back one hop."""
        worker = self.workers[action.worker_id]
        order = auction.order
        want = order.request.resources
        now_ms = self.clock.now_ms()
        answer: list[SimMachine] | ClaimRefused
        ledger = None
        try:
            eviction = self._admit(worker, order, action, now_ms)
        except ClaimRefused as exc:
            answer = exc
        else:
            answer = []
            for _ in action.indexes:
                machine_id = f"m{next(self._ids):08d}"
                if eviction is not None:
                    self._evict(worker, eviction, by=machine_id)
                worker.machines[machine_id] = want
                got = worker.admission.reserve(want)
                if got:
                    worker.gpu_ids[machine_id] = got
                worker.victims[machine_id] = Candidate(
                    machine_id=machine_id,
                    app=order.request.app,
                    priority_class=order.priority_class,
                    resources=want,
                    price=self._bids.get(order.request_id),
                    created_at=now_ms,
                    gpu_ids=got,
                )
                answer.append(SimMachine(machine_id, worker.id))
            ledger = worker.admission.version
            self._tell_usage(worker)

        def back() -> None:
            now = self.clock.monotonic()
            if isinstance(answer, ClaimRefused):
                usage = answer.details.get("usage")
                if isinstance(usage, dict):
                    broker.book.observe_usage(_usage(usage))
                reason = str(answer.details.get("reason", answer.status))
                actions = auction.refused(action.worker_id, reason, now, silent=False)
            else:
                actions = auction.claimed(action.worker_id, answer, now, ledger=ledger)
            self._perform(broker, auction, actions, finish)

        self.clock.call_later(self.hop_s, back)

    def _admit(
        self, worker: SimWorker, order: Order, action: SendClaim, now_ms: int
    ) -> Eviction | None:
        """The worker's word on a claim, as the agent's: it fits (None), or the machines it
        displaces (a single machine that may), or the refusal raised."""
        admission, want = worker.admission, order.request.resources
        try:
            admission.check_batch(worker.region, want, len(action.indexes), now_ms)
        except ClaimRefused:
            if not action.preempt or len(action.indexes) != 1:
                raise
            return admission.check_preempting_claim(
                worker.region,
                want,
                now_ms,
                claimant=order.priority_class,
                max_victims=action.preempt,
                candidates=worker.candidates(order.priority_class),
            )
        return None

    def _evict(self, worker: SimWorker, eviction: Eviction, *, by: str) -> None:
        """Give the victims' reservations back, and tell whoever listens."""
        at = self.clock.monotonic()
        for victim in eviction.victims:
            freed = worker.machines.pop(victim.machine_id)
            worker.victims.pop(victim.machine_id, None)
            worker.admission.release(freed, worker.gpu_ids.pop(victim.machine_id, ()))
            if self.on_preempted is not None:
                self.on_preempted(Evicted(worker.id, victim.machine_id, by, at))

    def _tell_usage(self, worker: SimWorker) -> None:
        usage = worker.admission.usage(
            self.clock.now_ms(), state=worker.state, machines=len(worker.machines)
        )
        for broker in self.brokers:
            self.clock.call_later(self.hop_s, _tell(broker.book, usage))


def _tell(book: WorkerBook, usage: WorkerUsage) -> Callable[[], None]:
    return lambda: book.observe_usage(usage)


def _usage(raw: dict[str, Any]) -> WorkerUsage:
    return WorkerUsage.model_validate(raw)
