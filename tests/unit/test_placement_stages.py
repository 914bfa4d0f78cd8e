"""Every filter rejects with its named reason (and accepts otherwise); every scorer stays in
[0, 1] and says what it should; Nomad's bin-pack formula gives Nomad's values."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from souq.model import (
    Constraint,
    Fingerprint,
    Load,
    Offer,
    Resources,
    WorkerInfo,
    WorkerState,
)
from souq.model.image import ImageLayer, ImageRecord, ImageRun
from souq.placement import (
    AntiAffinityScorer,
    BestFitScorer,
    BinPackScorer,
    CacheScorer,
    ConstraintFilter,
    Curve,
    DistinctWorkersFilter,
    DriverFilter,
    EligibleFilter,
    LoadScorer,
    PlacementRequest,
    RegionFilter,
    ResourcesFilter,
    SpreadScorer,
    StateFilter,
    WantedImage,
    nomad_binpack,
    short_digest,
    shortfall,
)


def offer(
    *,
    cpus: float = 4,
    memory_mb: int = 4096,
    disk_mb: int = 0,
    gpus: int = 0,
    used_cpus: float = 0,
    used_mb: int = 0,
    used_disk: int = 0,
    used_gpus: int = 0,
    state: WorkerState = WorkerState.UP,
    region: str = "mad",
    labels: dict[str, str] | None = None,
    drivers: list[str] | None = None,
    **extra: Any,
) -> Offer:
    fp = None
    if drivers is not None:
        fp = Fingerprint(
            hostname="h", os="linux", arch="x86_64", cpus=cpus, memory_mb=memory_mb, drivers=drivers
        )
    return Offer(
        worker=WorkerInfo(
            id="w1",
            region=region,
            state=state,
            capacity=Resources(cpus=cpus, memory_mb=memory_mb, disk_mb=disk_mb, gpus=gpus),
            allocated=Resources(
                cpus=used_cpus, memory_mb=used_mb, disk_mb=used_disk, gpus=used_gpus
            ),
            labels=labels or {},
            fingerprint=fp,
        ),
        eligible=extra.pop("eligible", True),
        **extra,
    )


def request(
    cpus: float = 1, memory_mb: int = 1024, disk_mb: int = 0, gpus: int = 0, **extra: Any
) -> PlacementRequest:
    return PlacementRequest(
        request_id="r1",
        app="web",
        region="mad",
        resources=Resources(cpus=cpus, memory_mb=memory_mb, disk_mb=disk_mb, gpus=gpus),
        **extra,
    )


# -- filters -------------------------------------------------------------------------------


def test_state_filter_rejects_cordoned_and_draining_workers() -> None:
    rejection = StateFilter().check(request(), offer(state=WorkerState.CORDONED))
    assert rejection is not None and rejection.reason == "cordoned"
    assert StateFilter().check(request(), offer()) is None
    plain = offer()
    # A state that a newer worker may send (model_copy does not validate).
    draining = plain.model_copy(
        update={"worker": plain.worker.model_copy(update={"state": "draining"})}
    )
    rejection = StateFilter().check(request(), draining)
    assert rejection is not None and rejection.reason == "draining"


def test_region_filter() -> None:
    rejection = RegionFilter().check(request(), offer(region="syd"))
    assert rejection is not None and rejection.reason == "wrong_region"
    assert "syd" in rejection.detail
    assert RegionFilter().check(request(), offer()) is None


def test_driver_filter() -> None:
    plain = replace(request(), driver="exec")
    rejection = DriverFilter().check(plain, offer(drivers=["sandbox"]))
    assert rejection is not None and rejection.reason == "driver_missing"
    assert rejection.unmet == "driver exec"
    assert DriverFilter().check(plain, offer(drivers=["exec", "sandbox"])) is None
    assert DriverFilter().check(plain, offer()) is None  # no fingerprint: benefit of doubt
    # A machine that names no driver runs on any worker: isolated where the worker can.
    assert DriverFilter().check(request(), offer(drivers=["exec"])) is None


def test_constraint_filter_names_the_first_constraint_not_met() -> None:
    ssd = Constraint.model_validate({"attribute": "label.disk", "value": "ssd"})
    zone = Constraint.model_validate(
        {"attribute": "label.zone", "operator": "in", "value": ["a", "b"]}
    )
    req = request(constraints=(ssd, zone))
    rejection = ConstraintFilter().check(req, offer(labels={"disk": "hdd", "zone": "c"}))
    assert rejection is not None
    assert rejection.reason == "constraint"
    assert rejection.unmet == "label.disk = ssd"
    assert rejection.detail == "label.disk = ssd: the worker has label.disk = hdd"
    rejection = ConstraintFilter().check(req, offer(labels={"disk": "ssd", "zone": "c"}))
    assert rejection is not None and rejection.unmet == "label.zone in [a, b]"
    assert ConstraintFilter().check(req, offer(labels={"disk": "ssd", "zone": "a"})) is None
    assert ConstraintFilter().check(request(), offer()) is None


def test_distinct_workers_filter() -> None:
    distinct = request(distinct_workers_for="app")
    rejection = DistinctWorkersFilter().check(distinct, offer(app_machines=2))
    assert rejection is not None and rejection.reason == "distinct_workers"
    assert rejection.detail == "worker already runs 2 machines of app web"
    assert DistinctWorkersFilter().check(distinct, offer(app_machines=0)) is None
    assert DistinctWorkersFilter().check(request(), offer(app_machines=2)) is None


def test_eligible_filter_keeps_the_workers_own_reason() -> None:
    rejection = EligibleFilter().check(
        request(), offer(eligible=False, reason="insufficient_cpu", detail="busy")
    )
    assert rejection is not None and (rejection.reason, rejection.detail) == (
        "insufficient_cpu",
        "busy",
    )
    rejection = EligibleFilter().check(request(), offer(eligible=False))
    assert rejection is not None and rejection.reason == "declined"
    assert EligibleFilter().check(request(), offer()) is None


@pytest.mark.parametrize(
    ("want", "worker", "reason"),
    [
        ({"cpus": 2}, {"used_cpus": 3}, "insufficient_cpu"),
        ({"memory_mb": 2048}, {"used_mb": 3000}, "insufficient_memory"),
        ({"disk_mb": 100}, {"disk_mb": 150, "used_disk": 100}, "insufficient_disk"),
        ({"gpus": 1}, {}, "insufficient_gpus"),
        ({"gpus": 2}, {"gpus": 2, "used_gpus": 1}, "insufficient_gpus"),
    ],
)
def test_resources_filter_names_the_resource_short(
    want: dict[str, Any], worker: dict[str, Any], reason: str
) -> None:
    rejection = ResourcesFilter().check(request(**want), offer(**worker))
    assert rejection is not None and rejection.reason == reason


def test_resources_fit_exactly() -> None:
    assert (
        ResourcesFilter().check(
            request(cpus=1, memory_mb=1024, disk_mb=50, gpus=1),
            offer(used_cpus=3, used_mb=3072, disk_mb=100, used_disk=50, gpus=1),
        )
        is None
    )
    short = shortfall(
        Resources(cpus=0, memory_mb=0, disk_mb=10),
        Resources(cpus=1, memory_mb=1, disk_mb=100),
        Resources(cpus=0, memory_mb=0, disk_mb=95),
    )
    assert short is not None and short.detail == "needs 10 MiB of disk; 5 of 100 MiB free"


# -- scorers -------------------------------------------------------------------------------

UTILS = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]


def at(cpu: float, mem: float) -> tuple[PlacementRequest, Offer]:
    """A request that takes a worker (10 cpus, 10000 MiB) to ``cpu`` and ``mem`` utilisation."""
    return request(cpus=1, memory_mb=1000), offer(
        cpus=10, memory_mb=10000, used_cpus=cpu * 10 - 1, used_mb=round(mem * 10000) - 1000
    )


@pytest.mark.parametrize(
    "scorer", [BestFitScorer(), BinPackScorer(), SpreadScorer()], ids=lambda s: s.name
)
def test_fit_scorers_are_bounded(scorer: Any) -> None:
    for cpu, mem in itertools.product(UTILS[1:], UTILS[1:]):
        value = scorer.score(*at(cpu, mem))
        assert 0.0 <= value <= 1.0, (scorer.name, cpu, mem, value)


def test_nomad_binpack_matches_nomads_formula() -> None:
    # score = 20 - (10^free_cpu + 10^free_mem), in [0, 18], normalised by 18.
    assert nomad_binpack(1.0, 1.0) == pytest.approx(1.0)  # 20 - (1 + 1) = 18
    assert nomad_binpack(0.0, 0.0) == pytest.approx(0.0)  # 20 - (10 + 10) = 0
    assert nomad_binpack(0.5, 0.5) == pytest.approx((20 - 2 * 10**0.5) / 18)  # 0.7597
    assert nomad_binpack(0.75, 0.25) == pytest.approx((20 - 10**0.25 - 10**0.75) / 18)
    assert nomad_binpack(1.5, -1) == nomad_binpack(1.0, 0.0)  # clamped to [0, 1]
    assert BinPackScorer().score(*at(0.5, 0.5)) == pytest.approx(nomad_binpack(0.5, 0.5))


def test_binpack_prefers_fuller_spread_prefers_emptier_best_fit_avoids_hot() -> None:
    half, hot = at(0.5, 0.5), at(0.95, 0.95)
    assert BinPackScorer().score(*hot) > BinPackScorer().score(*half)
    assert SpreadScorer().score(*hot) < SpreadScorer().score(*half)
    assert SpreadScorer().score(*at(0.5, 0.5)) == pytest.approx(0.5)
    assert BestFitScorer().score(*hot) < BestFitScorer().score(*half)


def test_best_fit_takes_its_curves_per_resource() -> None:
    rising = Curve.of([[0, 0], [1, 1]])
    scorer = BestFitScorer(cpu_curve=rising, memory_curve=Curve.of([[0, 1], [1, 1]]))
    assert scorer.score(*at(0.5, 0.1)) == pytest.approx((0.5 + 1.0) / 2)


def test_anti_affinity_penalises_machines_of_the_same_app() -> None:
    scorer = AntiAffinityScorer()
    values = [scorer.score(request(), offer(app_machines=n)) for n in range(5)]
    assert values == [1.0, 0.5, pytest.approx(1 / 3), 0.25, 0.2]


def test_load_scorer_reads_the_measured_load() -> None:
    scorer = LoadScorer()
    assert scorer.score(request(), offer()) is None  # not measured: no opinion
    idle = offer(load=Load(cpu_percent=0, memory_percent=0))
    busy = offer(load=Load(cpu_percent=90, memory_used_mb=900, memory_percent=50))
    assert scorer.score(request(), idle) == 1.0
    assert scorer.score(request(), busy) == pytest.approx(1 - (0.9 + 0.5) / 2)
    silly = offer(load=Load(cpu_percent=250, memory_percent=-5))
    assert scorer.score(request(), silly) == pytest.approx(0.5)  # clamped


MIB = 2**20


def image(*sizes: int) -> WantedImage:
    """An image of layers of ``sizes`` bytes."""
    return WantedImage("sha256:" + "a" * 64, tuple((f"{i:016x}", n) for i, n in enumerate(sizes)))


def test_cache_scorer_weighs_the_bytes_a_worker_would_pull() -> None:
    scorer = CacheScorer()
    big = image(48 * MIB, 16 * MIB)  # 64 MiB: a whole pull costs the whole range
    assert scorer.score(request(), offer(image_layers=2, image_bytes=0)) is None  # no image
    assert scorer.score(request(image=big), offer()) is None  # the worker does not say
    assert scorer.score(request(image=big), offer(image_layers=2, image_bytes=0)) == 1.0
    assert scorer.score(request(image=big), offer(image_layers=0, image_bytes=64 * MIB)) == 0.0
    # A quarter of it missing (the 16 MiB layer) costs a quarter.
    part = offer(image_layers=1, image_bytes=16 * MIB)
    assert scorer.score(request(image=big), part) == pytest.approx(0.75)
    # A small image missing whole costs little: 1 MiB is 1/64 of a full pull.
    small = image(MIB)
    cold = offer(image_layers=0, image_bytes=MIB)
    assert scorer.score(request(image=small), cold) == pytest.approx(1 - 1 / 64)
    # Past FULL_PULL the share missing is what counts: half of 128 MiB is 0.5.
    huge = image(64 * MIB, 64 * MIB)
    half = offer(image_layers=1, image_bytes=64 * MIB)
    assert scorer.score(request(image=huge), half) == pytest.approx(0.5)
    # An empty image needs no pull; a worker claiming more than the image is clamped to 0.
    assert scorer.score(request(image=image()), offer(image_layers=0, image_bytes=0)) == 1.0
    odd = offer(image_layers=0, image_bytes=10**12)
    assert scorer.score(request(image=big), odd) == 0.0


def test_a_wanted_image_counts_what_a_worker_holds() -> None:
    digests = ["sha256:" + c * 64 for c in "abc"]
    layers = [
        ImageLayer(digest=d, size=n, media_type="application/vnd.oci.image.layer.v1.tar+gzip")
        for d, n in zip(digests, (100, 20, 3), strict=True)
    ]
    record = ImageRecord(
        reference="sha256:" + "f" * 64,
        size=123,
        config_digest="sha256:" + "d" * 64,
        layers=layers,
        run=ImageRun(cmd=["true"]),
        created_at="2026-01-01T00:00:00.000Z",
    )
    wanted = WantedImage.of(record)
    assert wanted.reference == record.reference
    assert wanted.layers == (("a" * 16, 100), ("b" * 16, 20), ("c" * 16, 3))
    assert wanted.size == 123
    assert short_digest(digests[0]) == "a" * 16
    assert wanted.missing(set()) == (0, 123)
    assert wanted.missing({"b" * 16, "e" * 16}) == (1, 103)
    assert wanted.missing(frozenset(d for d, _ in wanted.layers)) == (3, 0)


def test_an_overcommitted_worker_is_short_not_an_error() -> None:
    # Capacity can shrink under existing reservations (an agent restarted with --cpus 1).
    short = shortfall(
        Resources(cpus=1, memory_mb=0),
        Resources(cpus=1, memory_mb=1),
        Resources(cpus=2, memory_mb=0),
    )
    assert short is not None and short.detail == "needs 1 cpus; 0 of 1 free"
