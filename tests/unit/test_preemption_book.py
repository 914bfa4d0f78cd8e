"""Preemption from the broker's book: a create that fits nowhere goes straight to a claim that
may displace, on a worker whose lower classes could free the room (as its heartbeats and usage
say), without a round of offers. Pure: no bus."""

from __future__ import annotations

from souq.market import AskOffers, Auction, Finished, Order, Purpose, Rules, SendClaim, WorkerBook
from souq.model import Resources, WorkerInfo, WorkerUsage
from souq.model.placement import Placement
from souq.model.protocol import Offer, OfferedEviction
from souq.model.worker import PreemptibleRoom
from souq.placement import PlacementRequest, default_pipeline


def res(cpus: float, memory_mb: int = 64, gpus: int = 0) -> Resources:
    return Resources(cpus=cpus, memory_mb=memory_mb, gpus=gpus)


def room(klass: str, cpus: float, machines: int, cheapest: float | None = None) -> PreemptibleRoom:
    return PreemptibleRoom(
        priority_class=klass, resources=res(cpus, 0), machines=machines, cheapest=cheapest
    )


def full(worker_id: str, *rooms: PreemptibleRoom, said: bool = True) -> WorkerInfo:
    """A worker of 4 cpus, all taken; ``rooms``: what its lower classes could free."""
    return WorkerInfo(
        id=worker_id,
        region="mad",
        capacity=res(4, 4096),
        allocated=res(4, 0),
        version=1,
        preemptible=list(rooms) if said else None,
    )


def auction(
    *workers: WorkerInfo,
    klass: str = "standard",
    want: Resources | None = None,
    purpose: Purpose = Purpose.CLAIM,
) -> Auction:
    book = WorkerBook()
    for w in workers:
        book.observe(w)
    request = PlacementRequest(request_id="r1", app="web", region="mad", resources=want or res(1))
    order = Order(request, purpose=purpose, preempt=8, priority_class=klass)
    ids = sorted(w.id for w in workers)
    return Auction(
        order,
        pipeline=default_pipeline(),
        book=book,
        rules=Rules(),
        now=0.0,
        up_workers=ids,
        live=lambda: len(ids),
    )


def test_a_create_that_fits_nowhere_claims_at_once_where_spot_machines_could_give_room() -> None:
    a = auction(full("w1", room("standard", 4, 4)), full("w2", room("spot", 2, 2, cheapest=3)))
    (claim,) = a.start(0.0)
    # No offers asked: the book says w2's spot machines could free a cpu (w1's are standard).
    assert isinstance(claim, SendClaim) and claim.worker_id == "w2" and claim.preempt == 8
    record = claim.record
    assert record.source == "book" and record.preemption is not None
    assert record.preemption.reason.startswith("the book knew no worker with room")
    assert record.preemption.displaces == ["spot"]
    # The book's count of victims is a guess: the record leaves it to the worker's answer.
    assert all(o.preempts is None for o in record.offers)
    (done,) = a.claimed("w2", ["machine"], 0.01)
    assert isinstance(done, Finished) and done.error is None
    assert isinstance(done.record, Placement) and done.record.winner == "w2"


def test_the_lowest_class_and_then_the_cheapest_bid_go_first() -> None:
    a = auction(
        full("w1", room("standard", 4, 4)),
        full("w2", room("spot", 1, 1, cheapest=9)),
        full("w3", room("spot", 1, 1, cheapest=2)),
        klass="reserved",
    )
    (claim,) = a.start(0.0)
    assert isinstance(claim, SendClaim) and claim.worker_id == "w3"


def test_fewer_machines_go_before_cheaper_ones() -> None:
    """Two spot machines of half a cpu each, against one of a whole cpu that bids more."""
    a = auction(full("w1", room("spot", 1, 2, cheapest=1)), full("w2", room("spot", 1, 1, 5)))
    (claim,) = a.start(0.0)
    assert isinstance(claim, SendClaim) and claim.worker_id == "w2"


def test_standard_machines_go_only_when_spot_ones_would_not_do() -> None:
    a = auction(full("w1", room("spot", 1, 1), room("standard", 3, 3)), klass="reserved")
    (claim,) = a.start(0.0)
    assert isinstance(claim, SendClaim) and claim.worker_id == "w1"
    a = auction(full("w1", room("spot", 1, 1), room("standard", 3, 3)), want=res(2))
    (ask,) = a.start(0.0)  # standard displaces no standard machine: the book knows none
    assert isinstance(ask, AskOffers) and ask.preempt


def test_a_refused_claim_asks_whom_each_worker_would_displace() -> None:
    """The book was wrong (the room went to another broker's create, or takes more victims than
    allowed): the worker's refusal sends the create to the offers, asked once."""
    a = auction(full("w1", room("spot", 2, 2)), full("w2", room("spot", 2, 2)))
    (first,) = a.start(0.0)
    assert isinstance(first, SendClaim)
    (second,) = a.refused(first.worker_id, "no_preemptible", 0.01, silent=False)
    assert isinstance(second, SendClaim) and second.worker_id != first.worker_id
    assert second.preempt == 8
    (ask,) = a.refused(second.worker_id, "no_preemptible", 0.02, silent=False)
    assert isinstance(ask, AskOffers) and ask.preempt
    eviction = OfferedEviction(victims=1, freed=res(1, 0), top_class=0, running=1)
    third = WorkerInfo(id="w3", region="mad", capacity=res(4, 4096), allocated=res(4, 0))
    (last,) = a.offers([Offer(worker=third, eligible=True, eviction=eviction)], 0.03)
    assert isinstance(last, SendClaim) and last.worker_id == "w3" and last.preempt == 8
    (done,) = a.refused("w3", "no_preemptible", 0.04, silent=False)
    assert isinstance(done, Finished) and done.error is not None
    assert done.record.preemption is not None


def test_a_book_that_does_not_say_and_a_dry_run_ask_for_offers() -> None:
    a = auction(full("w1", said=False))
    (ask,) = a.start(0.0)
    assert isinstance(ask, AskOffers) and ask.preempt
    a = auction(full("w1", room("spot", 2, 2)), purpose=Purpose.EXPLAIN)
    (ask,) = a.start(0.0)  # a dry run shows whom each worker would displace: it asks them
    assert isinstance(ask, AskOffers) and ask.preempt


def test_a_machine_that_wants_gpus_asks_for_offers() -> None:
    """The book does not follow which GPUs each machine holds."""
    gpu = WorkerInfo(
        id="w1",
        region="mad",
        capacity=res(4, 4096, gpus=1),
        allocated=res(4, 0, gpus=1),
        version=1,
        preemptible=[PreemptibleRoom(priority_class="spot", resources=res(4, 0, 1), machines=1)],
    )
    (ask,) = auction(gpu, want=res(1, gpus=1)).start(0.0)
    assert isinstance(ask, AskOffers) and ask.preempt


def test_a_usage_message_that_does_not_say_keeps_what_the_book_knew() -> None:
    """A refusal's usage does not say what lower classes could free: the heartbeat's word
    stands; a newer word that says replaces it."""
    book = WorkerBook()
    book.observe(full("w1", room("spot", 2, 2)))
    usage = WorkerUsage(
        worker_id="w1", region="mad", capacity=res(4, 4096), allocated=res(4, 0), version=2
    )
    book.observe_usage(usage)
    offer = book.offer("w1", "web", res(1), displace=("spot",))
    assert offer is not None and offer.eligible and offer.eviction is not None
    assert offer.eviction.estimated and offer.eviction.victims == 1
    book.observe_usage(usage.model_copy(update={"version": 3, "preemptible": []}))
    offer = book.offer("w1", "web", res(1), displace=("spot",))
    assert offer is not None and not offer.eligible and offer.eviction is None
    assert book.offer("w1", "web", res(1)) == book.offer("w1", "web", res(1), displace=())
