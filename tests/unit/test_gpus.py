"""GPUs: the request's rules, the fit GPU by GPU, the worker's ledger per GPU, the filter and
the book's view."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from souq.agent.capacity.admission import Admission
from souq.agent.state.store import Store
from souq.errors import ClaimRefused, InvalidInput
from souq.market.book import WorkerBook
from souq.model import MachineConfig, Resources
from souq.model.protocol import Offer
from souq.model.worker import WorkerInfo
from souq.placement import GpuFilter, PlacementRequest, default_pipeline
from souq.placement.gpus import free_of, free_on, gpu_misfit, pick, pick_many

NOW = 1_000_000


def gpu(gpus: int = 0, milli: int = 0, model: str | None = None) -> Resources:
    return Resources(cpus=1, memory_mb=64, gpus=gpus, gpu_milli=milli, gpu_model=model)


def node(n: int = 4, model: str | None = "V100M16") -> Resources:
    return Resources(cpus=64, memory_mb=65536, gpus=n, gpu_model=model)


# -- the request ---------------------------------------------------------------------------


def guest(**guest: Any) -> MachineConfig:
    return MachineConfig.model_validate({"cmd": ["true"], "guest": guest})


def test_a_share_is_gpu_milli_without_gpus() -> None:
    r = guest(gpu_milli=500, gpu_model="T4").guest.resources()
    assert (r.gpus, r.gpu_milli, r.gpu_model) == (0, 500, "T4")
    assert guest(gpus=2).guest.resources().gpus == 2
    assert guest(gpu_milli=1000).guest.resources().gpu_milli == 1000  # a whole one, as a share


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"gpus": 1, "gpu_milli": 500}, "gpu_milli"),
        ({"gpu_milli": 1001}, "gpu_milli"),
        ({"gpu_milli": -1}, "gpu_milli"),
        ({"gpu_model": "T4"}, "gpu_model"),  # a model, but no GPU asked for
        ({"gpus": 1, "gpu_model": "bad model"}, "gpu_model"),
    ],
)
def test_a_bad_gpu_request_is_refused_naming_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        guest(**fields)


def test_records_without_gpu_fields_load_and_read_as_before() -> None:
    old = {"cmd": ["true"], "guest": {"cpus": 1, "memory_mb": 64, "gpus": 1}}
    assert MachineConfig.model_validate(old).guest.resources() == Resources(
        cpus=1, memory_mb=64, gpus=1
    )
    # A size without shares or a model serialises exactly as before they existed.
    assert Resources(cpus=1, memory_mb=64).model_dump() == {
        "cpus": 1.0,
        "memory_mb": 64,
        "disk_mb": 0,
        "gpus": 0,
    }
    assert gpu(milli=300, model="T4").model_dump()["gpu_milli"] == 300


# -- the fit, GPU by GPU -------------------------------------------------------------------


def test_whole_gpus_take_the_lowest_wholly_free_ones() -> None:
    assert pick(gpu(2), (1000, 500, 1000, 1000)) == (0, 2)
    assert pick(gpu(2), (1000, 500, 999, 0)) is None
    assert pick(gpu(), (0, 0)) == ()


def test_a_share_takes_the_tightest_gpu_that_holds_it() -> None:
    assert pick(gpu(milli=300), (1000, 400, 350, 1000)) == (2,)
    assert pick(gpu(milli=300), (1000, 1000)) == (0,)  # a tie: the lowest index
    assert pick(gpu(milli=600), (500, 500, 500)) is None  # 1500 free, but on no one GPU


def test_shares_pack_onto_one_gpu_before_the_next() -> None:
    picks = pick_many(gpu(milli=250), (1000, 1000), 5)
    assert picks == [(0,), (0,), (0,), (0,), (1,)]


def test_a_worker_that_does_not_say_its_gpus_is_estimated_from_its_sums() -> None:
    cap = node(4)
    assert free_of(cap, Resources(cpus=0, memory_mb=0, gpus=1, gpu_milli=1300), ()) == (
        0,
        0,
        700,
        1000,
    )
    assert free_of(cap, Resources.zero(), [1000, 0, 1000, 1000]) == (1000, 0, 1000, 1000)


def test_misfits_name_the_reason() -> None:
    free = (1000, 200, 0, 0)
    assert gpu_misfit(gpu(1, model="T4"), node(), free)[0] == "wrong_gpu_model"  # type: ignore[index]
    assert gpu_misfit(gpu(1), node(model=None), free) is None  # no model asked: any
    assert gpu_misfit(gpu(2), node(), free)[0] == "insufficient_gpus"  # type: ignore[index]
    assert gpu_misfit(gpu(milli=300), node(), (200, 200))[0] == "insufficient_gpu_share"  # type: ignore[index]
    reason, detail = gpu_misfit(gpu(1), node(0, None), ()) or ("", "")
    assert reason == "insufficient_gpus" and "0 of 0" in detail
    assert gpu_misfit(gpu(milli=300), node(), (1000, 200), count=4)[0] == "insufficient_gpu_share"  # type: ignore[index]


# -- the worker's ledger -------------------------------------------------------------------


def ledger(n: int = 2, model: str | None = "V100M16") -> Admission:
    return Admission(worker_id="w1", region="mad", capacity=node(n, model))


def refusal(call: Any) -> str:
    with pytest.raises(ClaimRefused) as caught:
        call()
    return str(caught.value.details["reason"])


def test_admission_packs_shares_on_one_gpu_and_tells_which() -> None:
    a = ledger(2)
    got = []
    for _ in range(3):
        want = gpu(milli=300)
        a.check_claim("mad", want, NOW)
        got.append(a.reserve(want, a.gpus_for(want, NOW)))
    assert got == [(0,), (0,), (0,)]
    assert a.gpu_free(NOW) == (100, 1000)
    assert a.usage(NOW).gpu_free == [100, 1000]
    assert a.usage(NOW).allocated.gpu_milli == 900
    # A whole GPU still fits on the other one; two do not.
    a.check_claim("mad", gpu(1), NOW)
    assert refusal(lambda: a.check_claim("mad", gpu(2), NOW)) == "insufficient_gpus"
    a.check_claim("mad", gpu(milli=200), NOW)  # gpu 0 has 100 left: it goes to gpu 1
    assert a.gpus_for(gpu(milli=200), NOW) == (1,)


def test_admission_refuses_with_a_named_reason() -> None:
    a = ledger(2)
    a.reserve(gpu(1), (1,))
    assert refusal(lambda: a.check_claim("mad", gpu(2), NOW)) == "insufficient_gpus"
    assert refusal(lambda: a.check_claim("mad", gpu(1, model="T4"), NOW)) == "wrong_gpu_model"
    a.reserve(gpu(milli=700), (0,))
    assert refusal(lambda: a.check_claim("mad", gpu(milli=400), NOW)) == "insufficient_gpu_share"
    assert a.offer_refusal(gpu(milli=400), NOW) is not None
    assert refusal(lambda: a.check_batch("mad", gpu(milli=300), 2, NOW)) == "insufficient_gpu_share"
    a.check_batch("mad", gpu(milli=150), 2, NOW)


def test_release_gives_the_gpus_back() -> None:
    a = ledger(2)
    whole = a.reserve(gpu(2), a.gpus_for(gpu(2), NOW))
    assert whole == (0, 1) and a.gpu_free(NOW) == (0, 0)
    a.release(gpu(2), whole)
    assert a.gpu_free(NOW) == (1000, 1000)
    share = a.reserve(gpu(milli=500), a.gpus_for(gpu(milli=500), NOW))
    a.release(gpu(milli=500), share)
    assert a.gpu_free(NOW) == (1000, 1000) and a.reserved.gpu_milli == 0


def test_a_hold_keeps_its_gpus_for_its_claim() -> None:
    a = ledger(2)
    a.hold("q1", gpu(milli=600), NOW + 1000)
    assert a.gpu_free(NOW) == (400, 1000)
    assert a.gpus_for(gpu(milli=600), NOW, quote_id="q1") == (0,)
    assert a.gpu_free(NOW + 2000) == (1000, 1000)  # an expired hold holds nothing


def test_a_machine_cannot_change_its_gpus_in_place() -> None:
    a = ledger(2)
    with pytest.raises(InvalidInput, match="GPUs"):
        a.check_resize(gpu(1), gpu(2), NOW)
    a.check_resize(gpu(1), Resources(cpus=2, memory_mb=64, gpus=1, gpu_model=None), NOW)


def test_a_restart_adopts_the_gpus_its_machines_hold() -> None:
    a = Admission(
        worker_id="w1", region="mad", capacity=node(2), reserved=gpu(milli=300).plus(gpu(1))
    )
    a.adopt_gpus(gpu(milli=300), (1,))
    a.adopt_gpus(gpu(1), (0,))
    assert a.gpu_free(NOW) == (0, 700)


# -- placement -----------------------------------------------------------------------------


def worker(wid: str, n: int, free: list[int], model: str | None = "V100M16") -> WorkerInfo:
    return WorkerInfo(
        id=wid,
        region="mad",
        capacity=node(n, model),
        allocated=Resources.zero(),
        gpu_free=free,
    )


def request(want: Resources) -> PlacementRequest:
    return PlacementRequest(request_id="r1", app="a", region="mad", resources=want)


def test_the_gpu_filter_rejects_with_named_reasons() -> None:
    f = GpuFilter()
    full = Offer(worker=worker("w1", 2, [1000, 100]), eligible=True)
    assert f.check(request(gpu(1)), full) is None
    rejection = f.check(request(gpu(2)), full)
    assert rejection is not None and rejection.reason == "insufficient_gpus"
    rejection = f.check(request(gpu(milli=200)), full)
    assert rejection is None  # gpu 0 has room
    rejection = f.check(request(gpu(1, model="A10")), full)
    assert rejection is not None
    assert (rejection.reason, rejection.unmet) == ("wrong_gpu_model", "gpu_model A10")
    assert f.check(request(Resources(cpus=1, memory_mb=1)), full) is None  # no GPU asked


def test_the_pipeline_counts_gpu_rejections_and_scorers_see_per_gpu_state() -> None:
    offers = [
        Offer(worker=worker("w1", 2, [300, 1000]), eligible=True),
        Offer(worker=worker("w2", 2, [200, 0]), eligible=True),
        Offer(worker=worker("w3", 1, [1000], model="T4"), eligible=True),
    ]
    ranking = default_pipeline().rank(request(gpu(milli=500, model="V100M16")), offers)
    assert ranking.winner == "w1"
    assert ranking.rejections == {"insufficient_gpu_share": 1, "wrong_gpu_model": 1}
    assert ranking.unmet == {"wrong_gpu_model": ["gpu_model V100M16"]}
    assert free_on(offers[0].worker) == (300, 1000)
    # The record shows each worker's GPUs as placement saw them.
    assert {o.worker_id: o.gpu_free for o in ranking.outcomes} == {
        "w1": [300, 1000],
        "w2": [200, 0],
        "w3": [1000],
    }
    cpu_only = default_pipeline().rank(request(Resources(cpus=1, memory_mb=1)), offers)
    assert all(o.gpu_free is None for o in cpu_only.outcomes)


def test_the_book_judges_gpus_and_counts_its_own_claims_gpu_by_gpu() -> None:
    book = WorkerBook()
    book.observe(worker("w1", 2, [1000, 1000]).model_copy(update={"version": 1}))
    share = gpu(milli=600)
    offer = book.offer("w1", "a", share)
    assert offer is not None and offer.eligible
    book.charge("w1", share, version=2)
    book.charge("w1", share, version=3)
    offer = book.offer("w1", "a", share)
    assert offer is not None and not offer.eligible
    assert offer.reason == "insufficient_gpu_share"
    assert offer.worker.gpu_free == [400, 400]
    # The worker's own word of a newer version replaces the estimate.
    info = worker("w1", 2, [400, 1000]).model_copy(update={"version": 3})
    book.observe(info)
    offer = book.offer("w1", "a", share)
    assert offer is not None and offer.eligible


# -- the worker's state file ---------------------------------------------------------------


def test_a_state_file_without_gpu_columns_gains_them(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute(
        "CREATE TABLE reservations (machine_id TEXT PRIMARY KEY, millicpus INTEGER NOT NULL,"
        " memory_mb INTEGER NOT NULL, disk_mb INTEGER NOT NULL DEFAULT 0,"
        " gpus INTEGER NOT NULL DEFAULT 0)"
    )
    db.execute("INSERT INTO reservations VALUES ('m1', 1000, 64, 0, 1)")
    db.commit()
    db.close()
    store = Store(tmp_path)
    try:
        assert store.allocated() == Resources(cpus=1, memory_mb=64, gpus=1)
        assert store.load_machines() == []
    finally:
        store.close()
