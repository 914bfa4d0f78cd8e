"""Placement policies: validated, laid over the broker's defaults, built into pipelines whose
weights, curves, sample limit and seeded tie-breaks do what they say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from souq.model import Load, Offer, PlacementDefaults, PlacementPolicy, Resources, WorkerInfo
from souq.placement import (
    DEFAULT_WEIGHTS,
    NOT_SAMPLED,
    PipelineCache,
    PlacementRequest,
    WantedImage,
    build_pipeline,
    default_pipeline,
    weights_of,
)


def policy(**body: Any) -> PlacementPolicy:
    return PlacementPolicy.model_validate(body)


def offer(worker_id: str, used_cpus: float = 0, **extra: Any) -> Offer:
    return Offer(
        worker=WorkerInfo(
            id=worker_id,
            region="mad",
            capacity=Resources(cpus=4, memory_mb=4096),
            allocated=Resources(cpus=used_cpus, memory_mb=round(used_cpus * 1024)),
        ),
        eligible=True,
        **extra,
    )


def request(request_id: str = "r1", **extra: Any) -> PlacementRequest:
    return PlacementRequest(
        request_id=request_id,
        app="web",
        region="mad",
        resources=Resources(cpus=1, memory_mb=1024),
        **extra,
    )


MIB = 2**20


def image(size: int) -> WantedImage:
    """An image of one layer of ``size`` bytes."""
    return WantedImage("sha256:" + "a" * 64, (("a" * 16, size),))


def order(pipeline_result: Any) -> list[str]:
    return [o.worker.id for o in pipeline_result.ordered]


# -- the model -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"policy": "worst-fit"}, "policy"),
        ({"weights": {"bestfit": 1}}, "unknown scorer 'bestfit'; known scorers: best-fit, "),
        ({"weights": {"load": 11}}, "weight of load must be between 0 and 10"),
        ({"weights": {"load": -1}}, "between 0 and 10"),
        ({"curves": {"cpu": [[0, 1]]}}, "at least two"),
        ({"curves": {"cpu": [[0.5, 1], [0.2, 0]]}}, "strictly increasing"),
        ({"curves": {"memory": [[0, 1], [1, 2]]}}, "[0, 1]"),
        ({"curves": {"memory": [[0, 1, 2], [1, 0]]}}, "pair"),
        ({"curves": {"disk": [[0, 1], [1, 0]]}}, "Extra inputs"),
        ({"limit": 2}, "Extra inputs"),  # only the broker's defaults take a limit
    ],
)
def test_bad_policies_are_refused_naming_the_problem(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        policy(**body)
    assert message in str(err.value)


def test_a_policy_lays_over_the_defaults_field_by_field() -> None:
    defaults = PlacementDefaults.model_validate(
        {
            "policy": "spread",
            "weights": {"load": 1, "cache": 2},
            "curves": {"cpu": [[0, 0], [1, 1]]},
        }
    )
    merged = policy(weights={"cache": 0}, curves={"memory": [[0, 1], [1, 0]]}).over(defaults)
    assert merged.policy == "spread"  # not given: the default's
    assert merged.weights == {"load": 1, "cache": 0}
    assert merged.curves is not None
    assert merged.curves.cpu == [[0, 0], [1, 1]]
    assert merged.curves.memory == [[0, 1], [1, 0]]
    assert policy(policy="best-fit").over(defaults).policy == "best-fit"  # given: kept


# -- building ------------------------------------------------------------------------------


def test_the_default_chain() -> None:
    pipeline = default_pipeline()
    assert pipeline.name == "best-fit"
    assert [f.name for f in pipeline.filters] == [
        "state",
        "region",
        "driver",
        "constraints",
        "distinct-workers",
        "standby",
        "volume",
        "gpus",
        "eligible",
        "resources",
    ]
    assert pipeline.weights == {"best-fit": 1.0, "fragmentation": 1.0, **DEFAULT_WEIGHTS}
    assert pipeline.limit is None


def test_the_policy_picks_the_fit_scorer_and_weights_add_or_remove_scorers() -> None:
    defaults = PlacementDefaults()
    binpack = build_pipeline(policy(policy="binpack"), defaults)
    assert binpack.name == "binpack"
    assert binpack.weights == {"binpack": 1.0, **DEFAULT_WEIGHTS}
    blend = build_pipeline(policy(weights={"spread": 0.5, "load": 0, "cache": 3}), defaults)
    assert blend.weights == {
        "best-fit": 1.0,
        "fragmentation": 1.0,
        "spread": 0.5,
        "anti-affinity": 0.5,
        "cache": 3.0,
    }
    assert weights_of(policy(policy="spread"))["spread"] == 1.0


def test_binpack_and_spread_choose_opposite_workers() -> None:
    offers = [offer("empty"), offer("full-ish", used_cpus=2.5)]
    defaults = PlacementDefaults()
    assert order(build_pipeline(policy(policy="binpack"), defaults).rank(request(), offers))[0] == (
        "full-ish"
    )
    assert order(build_pipeline(policy(policy="spread"), defaults).rank(request(), offers))[0] == (
        "empty"
    )


def test_curves_reshape_best_fit() -> None:
    offers = [offer("empty"), offer("half", used_cpus=1)]
    assert order(default_pipeline().rank(request(), offers))[0] == "half"
    falling = {"cpu": [[0, 1], [1, 0]], "memory": [[0, 1], [1, 0]]}
    pipeline = build_pipeline(policy(curves=falling), PlacementDefaults())
    assert order(pipeline.rank(request(), offers))[0] == "empty"


def test_anti_affinity_spreads_an_app_unless_switched_off() -> None:
    # "busy" already runs a machine of the app; best fit alone would prefer it (50 % vs 25 %).
    offers = [offer("empty"), offer("busy", used_cpus=1, app_machines=1)]
    assert order(default_pipeline().rank(request(), offers))[0] == "empty"
    off = build_pipeline(policy(weights={"anti-affinity": 0}), PlacementDefaults())
    assert order(off.rank(request(), offers))[0] == "busy"


def test_load_and_cache_break_otherwise_even_offers() -> None:
    quiet = offer("quiet", load=Load(cpu_percent=5, memory_percent=20))
    busy = offer("busy", load=Load(cpu_percent=95, memory_percent=80))
    for i in range(10):
        assert order(default_pipeline().rank(request(f"r{i}"), [busy, quiet]))[0] == "quiet"
    big = image(64 * MIB)
    warm = offer("warm", image_layers=1, image_bytes=0)
    cold = offer("cold", image_layers=0, image_bytes=64 * MIB)
    for i in range(10):
        ranking = default_pipeline().rank(request(f"r{i}", image=big), [cold, warm])
        assert order(ranking)[0] == "warm"
    scores = {o.worker_id: o.scores for o in ranking.outcomes}
    assert scores["warm"]["cache"] == 1.0 and scores["cold"]["cache"] == 0.0


def test_a_large_image_cached_outweighs_anti_affinity_a_small_one_does_not() -> None:
    # Both workers are as full; "warm" runs a machine of the app and caches the image.
    warm = offer("warm", used_cpus=1, app_machines=1, image_layers=1, image_bytes=0)
    for size, winner in ((64 * MIB, "warm"), (MIB, "cold")):
        cold = offer("cold", used_cpus=1, image_layers=0, image_bytes=size)
        for i in range(10):
            ranking = default_pipeline().rank(request(f"r{i}", image=image(size)), [cold, warm])
            assert ranking.winner == winner, size
    # Weighed at 0.25 (cache's old default) a whole 64 MiB pull only ties with anti-affinity.
    cold = offer("cold", used_cpus=1, image_layers=0, image_bytes=64 * MIB)
    light = build_pipeline(policy(weights={"cache": 0.25}), PlacementDefaults())
    even = {
        o.worker_id: o.score
        for o in light.rank(request(image=image(64 * MIB)), [cold, warm]).outcomes
    }
    assert even["warm"] == pytest.approx(even["cold"])
    # An app that must spread says so: the hard rule beats any cache.
    spread = request(image=image(64 * MIB), distinct_workers_for="app")
    assert default_pipeline().rank(spread, [cold, warm]).winner == "cold"


def test_the_final_score_is_the_weighted_mean_of_the_scores_given() -> None:
    ranking = default_pipeline().rank(request(), [offer("w", used_cpus=1, app_machines=1)])
    [outcome] = ranking.outcomes
    assert set(outcome.scores) == {"best-fit", "anti-affinity"}  # load, cache: no opinion
    expected = (outcome.scores["best-fit"] * 1.0 + outcome.scores["anti-affinity"] * 0.5) / 1.5
    assert outcome.score == pytest.approx(expected, abs=1e-6)
    assert 0.0 <= outcome.score <= 1.0


def test_rankings_are_deterministic_per_request_id() -> None:
    twins = [offer(f"w{i}") for i in range(8)]
    pipeline = build_pipeline(policy(policy="spread"), PlacementDefaults())
    first = order(pipeline.rank(request("abc"), twins))
    assert first == order(pipeline.rank(request("abc"), list(reversed(twins))))
    winners = {pipeline.rank(request(f"r{i}"), twins).winner for i in range(40)}
    assert len(winners) > 1


def test_a_limit_scores_a_seeded_sample_and_says_so() -> None:
    offers = [offer(f"w{i}") for i in range(10)]
    pipeline = build_pipeline(None, PlacementDefaults(limit=2))
    ranking = pipeline.rank(request("abc"), offers)
    assert len(ranking.ordered) == 2
    assert ranking.rejections == {NOT_SAMPLED: 8}
    again = pipeline.rank(request("abc"), offers)
    assert order(again) == order(ranking)
    samples = {tuple(sorted(order(pipeline.rank(request(f"r{i}"), offers)))) for i in range(20)}
    assert len(samples) > 1


def test_rejections_record_what_was_not_met() -> None:
    from souq.model import Constraint

    ssd = Constraint.model_validate({"attribute": "label.disk", "value": "ssd"})
    ranking = default_pipeline().rank(
        request(constraints=(ssd,), distinct_workers_for="app"),
        [offer("a"), offer("b"), offer("c", app_machines=1)],
    )
    assert ranking.winner is None
    assert ranking.rejections == {"constraint": 3}  # constraints are checked first
    assert ranking.unmet == {"constraint": ["label.disk = ssd"]}


def test_the_cache_builds_each_policy_once() -> None:
    cache = PipelineCache(PlacementDefaults(), size=2)
    assert cache.get(None) is cache.default
    a = cache.get(policy(policy="binpack"))
    assert cache.get(policy(policy="binpack")) is a
    # Explicitly best-fit differs from unset only in what it overrides: both are cached apart.
    b = cache.get(policy(weights={"load": 1}))
    c = cache.get(policy(policy="spread"))
    assert {a.name, b.name, c.name} == {"binpack", "best-fit", "spread"}
    assert cache.get(policy(policy="binpack")) is not a  # evicted (size 2), built again


def test_the_brokers_gpu_workload_is_what_fragmentation_measures_against() -> None:
    from souq.model.policy import GpuShape
    from souq.placement.fragmentation import DEFAULT_WORKLOAD, Shape
    from souq.placement.gpu_scorers import FgdScorer

    def workload_of_pipeline(defaults: PlacementDefaults) -> tuple[Shape, ...]:
        (scorer,) = [s for s in build_pipeline(None, defaults).scorers if s.name == "fragmentation"]
        assert isinstance(scorer, FgdScorer)
        return tuple(scorer.workload)

    assert workload_of_pipeline(PlacementDefaults()) == DEFAULT_WORKLOAD
    mix = PlacementDefaults(
        gpu_workload=[
            GpuShape(cpus=8, gpus=1, share=0.75),
            GpuShape(cpus=2, gpu_milli=500, gpu_model="T4", share=0.25),
        ]
    )
    assert workload_of_pipeline(mix) == (
        Shape(8000, 1000, 1, "", 0.75),
        Shape(2000, 500, 1, "T4", 0.25),
    )
    with pytest.raises(ValidationError, match="not both"):
        GpuShape(cpus=1, gpus=1, gpu_milli=500, share=1)


def test_a_bad_placement_file_stops_the_broker_with_its_reason(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "placement.json"
    bad.write_text('{"gpu_workload": [{"cpus": 1, "share": 2}]}')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "souq",
            "broker",
            "--nats",
            "nats://127.0.0.1:1",
            "--placement",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "gpu_workload.0.share" in done.stderr
