"""The default placement pipeline: best fit below the knee, no hot spots, named rejections, and
a tie-break that is random yet repeatable."""

from __future__ import annotations

from souq.model import Offer, Resources, WorkerInfo
from souq.placement import PlacementRequest, default_pipeline


def offer(
    worker_id: str,
    *,
    cpus: float = 4,
    memory_mb: int = 4096,
    used_cpus: float = 0,
    used_mb: int = 0,
    eligible: bool = True,
    reason: str | None = None,
) -> Offer:
    return Offer(
        worker=WorkerInfo(
            id=worker_id,
            region="mad",
            capacity=Resources(cpus=cpus, memory_mb=memory_mb),
            allocated=Resources(cpus=used_cpus, memory_mb=used_mb),
        ),
        eligible=eligible,
        reason=reason,
    )


def request(cpus: float = 1, memory_mb: int = 1024, request_id: str = "r1") -> PlacementRequest:
    return PlacementRequest(
        request_id=request_id,
        app="web",
        region="mad",
        resources=Resources(cpus=cpus, memory_mb=memory_mb),
    )


def test_best_fit_prefers_the_fuller_worker_below_the_knee() -> None:
    ranking = default_pipeline().rank(
        request(), [offer("empty"), offer("half", used_cpus=1, used_mb=1024)]
    )
    # After placement: "half" sits at 50 % (rising part of the curve), "empty" at 25 %.
    assert [o.worker.id for o in ranking.ordered] == ["half", "empty"]
    assert ranking.winner == "half"
    assert ranking.runner_up == "empty"
    best, second = ranking.outcomes[:2]
    assert best.score is not None and second.score is not None and best.score > second.score
    assert set(best.scores) == {"best-fit", "anti-affinity"}  # no load, no image: no opinion


def test_best_fit_avoids_pushing_a_worker_past_ninety_percent() -> None:
    hot = offer("hot", cpus=10, memory_mb=10240, used_cpus=8.5, used_mb=8704)
    cool = offer("cool", cpus=10, memory_mb=10240)
    ranking = default_pipeline().rank(request(), [hot, cool])
    # "hot" would reach 95 %: it still fits, but ranks below the empty worker.
    assert [o.worker.id for o in ranking.ordered] == ["cool", "hot"]


def test_exactly_full_is_feasible_but_last() -> None:
    ranking = default_pipeline().rank(
        request(), [offer("fills", used_cpus=3, used_mb=3072), offer("empty")]
    )
    assert [o.worker.id for o in ranking.ordered] == ["empty", "fills"]
    assert ranking.rejections == {}


def test_rejections_carry_named_reasons_and_are_counted() -> None:
    offers = [
        offer("cordoned", eligible=False, reason="cordoned"),
        offer("no-cpu", used_cpus=3.5),
        offer("no-cpu-2", cpus=0.5),
        offer("no-mem", used_mb=4000),
        offer("ok"),
    ]
    ranking = default_pipeline().rank(request(), offers)
    assert ranking.winner == "ok"
    assert ranking.rejections == {"cordoned": 1, "insufficient_cpu": 2, "insufficient_memory": 1}
    by_worker = {o.worker_id: o for o in ranking.outcomes}
    assert by_worker["no-cpu"].rejected == "insufficient_cpu"
    assert by_worker["no-cpu"].detail == "needs 1 cpus; 0.5 of 4 free"
    assert by_worker["no-mem"].detail == "needs 1024 MiB; 96 of 4096 MiB free"
    assert by_worker["cordoned"].score is None
    # Feasible offers come first in the record, best first.
    assert ranking.outcomes[0].worker_id == "ok"


def test_nothing_feasible_gives_no_winner() -> None:
    ranking = default_pipeline().rank(request(cpus=8), [offer("a"), offer("b")])
    assert ranking.ordered == []
    assert ranking.winner is None and ranking.runner_up is None
    assert ranking.rejections == {"insufficient_cpu": 2}


def test_ties_break_by_a_shuffle_seeded_from_the_request_id() -> None:
    twins = [offer(f"w{i}") for i in range(6)]
    pipeline = default_pipeline()
    first = [o.worker.id for o in pipeline.rank(request(request_id="abc"), twins).ordered]
    again = [o.worker.id for o in pipeline.rank(request(request_id="abc"), twins).ordered]
    assert first == again  # deterministic for one request id
    winners = {pipeline.rank(request(request_id=f"r{i}"), twins).winner for i in range(40)}
    assert len(winners) > 1  # but spread across request ids
    reordered = [o.worker.id for o in pipeline.rank(request(request_id="abc"), twins).ordered]
    assert sorted(reordered) == sorted(o.worker.id for o in twins)
