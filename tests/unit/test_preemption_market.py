"""Preemption in the market core: the auction's second look (offers that say whom each worker
would displace) and the worker's admission (whom a claim displaces). Pure: no bus."""

from __future__ import annotations

import pytest

from souq.agent.capacity.admission import Admission
from souq.errors import ClaimRefused, InsufficientCapacity
from souq.market import AskOffers, Auction, Finished, Order, Purpose, Rules, SendClaim, WorkerBook
from souq.market.preemption import Candidate
from souq.model import Resources, WorkerInfo
from souq.model.placement import Placement
from souq.model.protocol import Offer, OfferedEviction
from souq.placement import PlacementRequest, default_pipeline


def res(cpus: float, memory_mb: int = 64) -> Resources:
    return Resources(cpus=cpus, memory_mb=memory_mb)


def info(worker_id: str, used: float) -> WorkerInfo:
    return WorkerInfo(id=worker_id, region="mad", capacity=res(4, 4096), allocated=res(used, 0))


def order(klass: str = "standard", purpose: Purpose = Purpose.CLAIM, preempt: int = 8) -> Order:
    request = PlacementRequest(request_id="r1", app="web", region="mad", resources=res(1))
    return Order(request, purpose=purpose, preempt=preempt, priority_class=klass)


def auction(o: Order) -> Auction:
    book = WorkerBook()
    for w in ("w1", "w2", "w3"):
        book.observe(info(w, used=4))  # the region is full
    return Auction(
        o,
        pipeline=default_pipeline(),
        book=book,
        rules=Rules(),
        now=0.0,
        up_workers=["w1", "w2", "w3"],
        live=lambda: 3,
    )


def lone_worker(used: float) -> Auction:
    """An auction for ``order()`` in a region of one worker, ``used`` of its 4 cpus taken as the
    book last heard."""
    book = WorkerBook()
    book.observe(info("w1", used=used))
    return Auction(
        order(),
        pipeline=default_pipeline(),
        book=book,
        rules=Rules(),
        now=0.0,
        up_workers=["w1"],
        live=lambda: 1,
    )


def full(worker_id: str) -> Offer:
    return Offer(worker=info(worker_id, 4), eligible=False, reason="insufficient_cpu")


def evicting(worker_id: str, victims: int, *, top: int = 0, priced: float = 0.0) -> Offer:
    eviction = OfferedEviction(
        victims=victims, freed=res(victims, 0), top_class=top, priced=priced, running=victims
    )
    return Offer(worker=info(worker_id, 4), eligible=True, eviction=eviction)


def to_preemption(a: Auction) -> AskOffers:
    # The book knows no worker with room: the offers asked say whom each would displace.
    (ask,) = a.start(0.0)
    assert isinstance(ask, AskOffers) and ask.preempt
    return ask


def test_a_create_that_fits_nowhere_asks_whom_each_worker_would_displace() -> None:
    a = auction(order())
    ask = to_preemption(a)
    assert ask.preempt and ask.expect == 3
    offers = [evicting("w1", 2), evicting("w2", 1, priced=5), evicting("w3", 1, priced=1)]
    (claim,) = a.offers(offers, 0.02)
    # The fewest victims, then the cheapest: w3; the claim lets the worker displace.
    assert isinstance(claim, SendClaim) and claim.worker_id == "w3" and claim.preempt == 8
    assert claim.record.preemption.priority_class == "standard"
    assert claim.record.preemption.reason.startswith("the book knew no worker with room")
    assert claim.record.preemption.displaces == ["spot"]
    (done,) = a.claimed("w3", ["machine"], 0.03)
    assert isinstance(done, Finished) and done.error is None
    record = done.record
    assert isinstance(record, Placement) and record.winner == "w3"
    assert {o.worker_id: o.preempts for o in record.offers} == {"w1": 2, "w2": 1, "w3": 1}


def test_spot_displaces_nobody_and_is_refused_at_once() -> None:
    a = auction(order("spot"))
    a.start(0.0)
    (done,) = a.offers([full("w1"), full("w2"), full("w3")], 0.01)
    assert isinstance(done, Finished) and isinstance(done.error, InsufficientCapacity)
    assert done.record.preemption is None


def test_a_worker_with_room_now_beats_any_that_would_displace() -> None:
    a = auction(order("reserved"))
    to_preemption(a)
    room = Offer(worker=info("w2", 2), eligible=True)  # another create's machine went away
    (claim,) = a.offers([evicting("w1", 1), room, evicting("w3", 1)], 0.02)
    assert isinstance(claim, SendClaim) and claim.worker_id == "w2"


def test_spot_victims_go_before_standard_ones() -> None:
    a = auction(order("reserved"))
    to_preemption(a)
    (claim,) = a.offers([evicting("w1", 1, top=1), evicting("w2", 2, top=0)], 0.02)
    assert isinstance(claim, SendClaim) and claim.worker_id == "w2"


def test_a_refused_preempting_claim_goes_to_the_next_and_nothing_left_is_refused() -> None:
    a = auction(order())
    to_preemption(a)
    (first,) = a.offers([evicting("w1", 1), evicting("w2", 2)], 0.02)
    assert isinstance(first, SendClaim) and first.worker_id == "w1"
    (second,) = a.refused("w1", "no_preemptible", 0.03, silent=False)
    assert isinstance(second, SendClaim) and second.worker_id == "w2" and second.preempt == 8
    (done,) = a.refused("w2", "no_preemptible", 0.04, silent=False)
    assert isinstance(done, Finished) and isinstance(done.error, InsufficientCapacity)
    assert "2 claims refused (no_preemptible)" in done.error.message
    assert done.record.preemption is not None  # the refusal says preemption was looked at


def test_no_preemption_when_the_broker_allows_none() -> None:
    a = auction(order(preempt=0))
    a.start(0.0)
    (done,) = a.offers([full("w1")], 0.01)
    assert isinstance(done, Finished) and done.error is not None


def test_claims_refused_where_the_book_saw_room_lead_to_asking_whom_to_displace() -> None:
    a = lone_worker(used=3)  # room, as the book last heard
    (claim,) = a.start(0.0)
    assert isinstance(claim, SendClaim) and claim.preempt == 0
    (ask,) = a.refused("w1", "insufficient_cpu", 0.01, silent=False)
    assert isinstance(ask, AskOffers) and not ask.preempt  # the book was stale: fresh offers
    (again,) = a.offers([full("w1")], 0.02)
    assert isinstance(again, AskOffers) and again.preempt
    (last,) = a.offers([evicting("w1", 1)], 0.03)
    assert isinstance(last, SendClaim) and last.worker_id == "w1" and last.preempt == 8
    assert last.record.preemption.reason == "no worker had room for it as it is"


def test_a_dry_run_shows_whom_it_would_displace_and_claims_nothing() -> None:
    a = auction(order(purpose=Purpose.EXPLAIN))
    (ask,) = a.start(0.0)
    assert isinstance(ask, AskOffers) and ask.preempt
    (done,) = a.offers([evicting("w1", 3), evicting("w2", 1)], 0.02)
    assert isinstance(done, Finished) and done.error is None and not done.placed
    assert done.record.winner == "w2"


# -- the worker's admission --------------------------------------------------------------------


def spot(i: int, price: float | None = None) -> Candidate:
    return Candidate(f"s{i}", "batch", "spot", res(1, 256), price=price, created_at=i)


def test_claims_in_turn_each_displace_only_what_they_need() -> None:
    """Three brokers' claims reach one full worker one after the other (the agent takes them in
    turn): each displaces one spot machine, the room the one before freed is not freed twice."""
    a = Admission(worker_id="w1", region="mad", capacity=res(4, 4096))
    victims = {f"s{i}": spot(i, price=i) for i in range(4)}
    for v in victims.values():
        a.reserve(v.resources)
    evicted: list[str] = []
    for _ in range(3):
        plan = a.check_preempting_claim(
            "mad",
            res(1, 256),
            0,
            claimant="standard",
            max_victims=8,
            candidates=list(victims.values()),
        )
        assert len(plan.victims) == 1
        for v in plan.victims:  # what the shell does: give back, then record the new one
            a.release(v.resources)
            del victims[v.machine_id]
            evicted.append(v.machine_id)
        a.reserve(res(1, 256))
    assert evicted == ["s0", "s1", "s2"]  # the cheapest first
    assert a.reserved == res(4, 1024)


def test_a_claim_that_fits_displaces_nobody() -> None:
    a = Admission(worker_id="w1", region="mad", capacity=res(4, 4096))
    a.reserve(res(1, 256))
    plan = a.check_preempting_claim(
        "mad", res(1, 256), 0, claimant="standard", max_victims=8, candidates=[spot(0)]
    )
    assert plan.victims == ()


def test_no_allowed_victim_is_a_refusal_naming_why() -> None:
    a = Admission(worker_id="w1", region="mad", capacity=res(1, 4096))
    a.reserve(res(1, 256))
    standard = Candidate("m1", "web", "standard", res(1, 256))
    with pytest.raises(ClaimRefused) as caught:
        a.check_preempting_claim(
            "mad", res(1, 256), 0, claimant="standard", max_victims=8, candidates=[standard]
        )
    assert caught.value.details["reason"] == "no_preemptible"
    assert "usage" in caught.value.details


def test_a_cordoned_worker_displaces_nobody() -> None:
    a = Admission(worker_id="w1", region="mad", capacity=res(1, 4096), cordoned=True)
    a.reserve(res(1, 256))
    with pytest.raises(ClaimRefused) as caught:
        a.check_preempting_claim(
            "mad", res(1, 256), 0, claimant="reserved", max_victims=8, candidates=[spot(0)]
        )
    assert caught.value.details["reason"] == "cordoned"


def test_a_create_whose_only_worker_did_not_answer_does_not_look_for_victims() -> None:
    """Displacing machines frees room; it does not make a worker answer. A create whose claim was
    refused as unavailable, with room on the worker, ends there: no second round of offers."""
    a = lone_worker(used=0)  # room for it
    (claim,) = a.start(0.0)
    assert isinstance(claim, SendClaim) and claim.worker_id == "w1" and claim.preempt == 0
    actions = a.refused("w1", "unavailable", 0.01, silent=False)
    while not isinstance(actions[0], Finished):  # the rest of the region, if it asks for it
        assert isinstance(actions[0], AskOffers) and not actions[0].preempt, actions
        actions = a.offers([], 0.02)
    (done,) = actions
    assert isinstance(done, Finished) and done.error is not None
    assert done.record.preemption is None


def test_a_create_refused_for_room_does_look_for_victims() -> None:
    a = lone_worker(used=0)
    (claim,) = a.start(0.0)
    assert isinstance(claim, SendClaim)
    actions = a.refused("w1", "insufficient_cpu", 0.01, silent=False)
    asks = [x for x in actions if isinstance(x, AskOffers)]
    while asks and not asks[0].preempt:
        actions = a.offers([], 0.02)
        asks = [x for x in actions if isinstance(x, AskOffers)]
    assert asks and asks[0].preempt, actions
