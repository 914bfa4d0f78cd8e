"""The quota core (souq.model.quota), pure: what a ledger admits, how a create's reservation
settles, and what reconciliation does with a dead broker's reservation."""

from __future__ import annotations

import json
import random

import pytest
from pydantic import ValidationError

from souq.model.choices import PriorityClass
from souq.model.quota import (
    BATCH_MARK,
    AllLimits,
    ClassLimits,
    QuotaEntry,
    QuotaLimits,
    QuotaRecord,
    QuotaUse,
    drafted,
    encoded,
    excess,
    held,
    released,
    reserved,
    sealed,
    use_of_class,
    use_of_record,
    view_of,
    with_line,
)
from souq.model.quota_reconcile import ClusterMachine, ClusterVolumes, reconciled

SPOT = PriorityClass.SPOT
ONE = QuotaUse(cpus=1, memory_mb=256, machines=1)


def record(**limits: float) -> QuotaRecord:
    return QuotaRecord(scope="app", name="web", limits=QuotaLimits(**limits))  # type: ignore[arg-type]


def pending(
    request_id: str, use: QuotaUse = ONE, deadline_ms: int = 1_000, klass: str = ""
) -> QuotaEntry:
    return QuotaEntry(
        app="web", request_id=request_id, use=use, deadline_ms=deadline_ms, priority_class=klass
    )


def machine(
    machine_id: str, request_id: str, *, destroyed: bool = False, klass: str = "standard"
) -> ClusterMachine:
    return ClusterMachine(machine_id, "web", request_id, ONE, destroyed, klass)


def test_a_ledger_admits_up_to_its_limit_and_names_the_first_it_would_pass() -> None:
    r = record(machines=2, cpus=4)
    r = reserved(r, pending("a"))
    r = held(r, "a", {"m1": ONE})
    assert excess(r, ONE) is None
    r = reserved(r, pending("b"))
    over = excess(r, ONE)
    assert over is not None
    assert (over.dimension, over.limit, over.use, over.asked) == ("machines", 2, 2, 1)
    assert "limit 2 machines, in use 2" in over.message()
    assert over.quota == "machines" and over.priority_class == "all"
    three_cpus = QuotaUse(cpus=3, memory_mb=0, machines=0)
    assert excess(record(cpus=4), three_cpus) is None
    cpu_over = excess(reserved(record(cpus=4), pending("c", three_cpus)), three_cpus)
    assert cpu_over is not None and cpu_over.dimension == "cpus"


def test_a_settled_create_is_held_per_machine_and_a_destroy_releases_it() -> None:
    r = reserved(record(machines=3), pending("batch", QuotaUse(cpus=3, memory_mb=0, machines=3)))
    r = held(r, "batch", {"m1": ONE, "m2": ONE})  # one of three placed
    assert set(r.held) == {"m1", "m2"} and not r.pending
    assert use_of_record(r).machines == 2
    assert use_of_record(released(r, ["m1"])).machines == 1
    assert held(reserved(r, pending("x")), "x", {}) == r  # none made: dropped


def test_a_dead_brokers_reservation_is_reconciled_only_past_its_deadline() -> None:
    r = reserved(record(machines=1), pending("lost", deadline_ms=1_000))
    r = reserved(r, pending("made", deadline_ms=1_000))
    cluster = [machine("m9", "made")]
    early = reconciled(r, cluster, apps={"web"}, now_ms=999)
    assert set(early.pending) == {"lost", "made"}  # still under way: counted, never dropped
    assert use_of_record(early).machines == 2
    late = reconciled(r, cluster, apps={"web"}, now_ms=1_000)
    assert set(late.held) == {"m9"} and not late.pending  # the lost one freed, the made held


def test_reconciling_drops_destroyed_machines_and_counts_those_never_counted() -> None:
    r = held(reserved(record(machines=5), pending("a")), "a", {"m1": ONE})
    cluster = [
        machine("m1", "a", destroyed=True),
        machine("m2", "b"),  # made before the quota was set
        machine("m3", "c~b-0"),  # a batch's machine whose create is under way
        machine("m4", "other", destroyed=True),
    ]
    r = reserved(r, pending("c", deadline_ms=5_000))
    out = reconciled(r, cluster, apps={"web"}, now_ms=2_000)
    assert set(out.held) == {"m2"} and set(out.pending) == {"c"}
    assert BATCH_MARK == "~b"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"machines": -1}, "machines"),
        ({"cpus": "4"}, "cpus"),
        ({"memory_mb": 1.5}, "memory_mb"),
        ({"volume_gb": -2}, "volume_gb"),
        ({"x": 1}, "x"),
        ({"classes": {"gold": {"cpus": 1}}}, "gold"),  # an unknown class
        ({"classes": {"spot": {"volume_gb": 1}}}, "volume_gb"),  # volumes have no class
        ({"classes": {"spot": {"cpus": -1}}}, "cpus"),
    ],
)
def test_bad_limits_are_refused_naming_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        QuotaLimits.model_validate(body)
    assert any(field in [str(p) for p in e["loc"]] for e in caught.value.errors())


def spot(request_id: str, use: QuotaUse = ONE) -> QuotaEntry:
    return pending(request_id, use, klass="spot")


def test_a_class_line_counts_that_class_only_and_the_all_line_counts_every_class() -> None:
    limits = QuotaLimits(machines=3, classes={SPOT: ClassLimits(machines=1, cpus=5)})
    r = QuotaRecord(scope="app", name="web", limits=limits)
    r = reserved(r, spot("s1"))
    over = excess(r, ONE, "spot")
    assert over is not None
    assert (over.quota, over.priority_class, over.limit, over.use) == (
        "spot.machines",
        "spot",
        1,
        1,
    )
    assert "over its spot machines quota: limit 1 machines, in use 1" in over.message()
    assert excess(r, ONE, "standard") is None  # no line of its own: only the all line
    assert excess(r, ONE, "") is None  # a ledger from before classes: standard
    r = reserved(reserved(r, pending("a")), pending("b", klass="reserved"))
    all_over = excess(r, ONE, "standard")
    assert all_over is not None and all_over.quota == "machines"  # 3 of 3, whatever the class
    r = held(r, "s1", {"m1": ONE})
    assert use_of_class(r, "spot").machines == 1 and use_of_class(r, "standard").machines == 1
    shown = view_of(r)
    assert shown.use.machines == 3 and shown.use_by_class["reserved"].machines == 1


def test_an_update_moving_a_machine_to_a_class_counts_all_of_it_there() -> None:
    limits = QuotaLimits(cpus=10, classes={SPOT: ClassLimits(cpus=1)})
    r = held(
        reserved(QuotaRecord(scope="app", name="web", limits=limits), pending("a")),
        "a",
        {"m1": ONE},
    )
    growth = QuotaUse()  # same size: the all line asks nothing
    moved = excess(r, growth, "spot", class_asked=QuotaUse(cpus=2, memory_mb=256, machines=1))
    assert moved is not None and moved.quota == "spot.cpus" and moved.asked == 2
    assert excess(r, growth, "spot", class_asked=ONE) is None


def test_volumes_count_their_size_on_the_all_line() -> None:
    r = QuotaRecord(scope="app", name="web", limits=QuotaLimits(volume_gb=10))
    vol = QuotaUse(volume_gb=6)
    r = reserved(r, pending("v", vol))
    over = excess(r, QuotaUse(volume_gb=5))
    assert over is not None and (over.quota, over.limit, over.use, over.asked) == (
        "volume_gb",
        10,
        6,
        5,
    )
    assert "limit 10 GB, in use 6, this asks 5 more" in over.message()
    r = held(r, "v", {}, {"vol_w1_a": 6})
    assert r.volumes == {"vol_w1_a": 6} and use_of_record(r).volume_gb == 6
    assert use_of_class(r, "standard").volume_gb == 0
    r = held(reserved(r, pending("x", QuotaUse(volume_gb=4))), "x", {}, {"vol_w1_a": 10})
    assert use_of_record(r).volume_gb == 10 and excess(r, QuotaUse(volume_gb=1)) is not None
    assert use_of_record(released(r, ["vol_w1_a"])).volume_gb == 0


def test_reconciling_volumes_trusts_only_the_workers_that_answered() -> None:
    r = QuotaRecord(
        scope="app",
        name="web",
        limits=QuotaLimits(volume_gb=10),
        volumes={"vol_w1_a": 2, "vol_w2_b": 3, "vol_w1_c": 1},
    )
    live = ClusterVolumes(
        sizes={"vol_w1_a": 4, "vol_w1_d": 5},  # a extended, c destroyed, d never counted
        listed=lambda vid: vid.startswith("vol_w1_"),  # w2 did not answer: b stays
    )
    out = reconciled(r, [], apps={"web"}, now_ms=0, volumes=live)
    assert out.volumes == {"vol_w1_a": 4, "vol_w2_b": 3, "vol_w1_d": 5}
    assert reconciled(r, [], apps={"web"}, now_ms=0).volumes == r.volumes  # not read: kept


def test_a_line_is_replaced_alone() -> None:
    limits = QuotaLimits(cpus=8, classes={SPOT: ClassLimits(machines=2)})
    out = with_line(limits, "all", AllLimits(machines=5, volume_gb=20))
    assert (out.cpus, out.machines, out.volume_gb) == (None, 5, 20)
    assert out.classes[SPOT].machines == 2
    out = with_line(out, "reserved", ClassLimits(cpus=4))
    assert set(out.classes) == {"spot", "reserved"} and out.machines == 5
    out = with_line(out, "spot", ClassLimits())
    assert set(out.classes) == {"reserved"}


def test_reconciling_takes_a_machines_class_as_it_is() -> None:
    r = held(reserved(record(), pending("a")), "a", {"m1": ONE})
    assert r.held["m1"][2] == ""
    out = reconciled(r, [machine("m1", "a", klass="spot")], apps={"web"}, now_ms=0)
    assert out.held["m1"] == (1, 256, "spot")


@pytest.mark.parametrize("batch", [0, 1, 7])
def test_running_sums_and_the_written_ledger_match_what_a_fresh_read_makes(batch: int) -> None:
    """A ledger changed many times (creates, batches, updates, volumes, releases) in turn sums
    and encodes as the same ledger read afresh from its JSON does — changed record by record,
    or in drafts of ``batch`` steps (a group commit's), which leave the record they were made
    of as it was."""
    rng = random.Random(35)
    limits = QuotaLimits(machines=10**6, classes={SPOT: ClassLimits(cpus=10**6)})
    r = QuotaRecord(scope="app", name="web", limits=limits)
    made = 0
    base, base_json = r, encoded(r)
    for step in range(400):
        if batch and step % batch == 0:
            # A draft never changes what it was made of: its ledger, its sums.
            before = QuotaRecord.model_validate_json(base_json)
            assert base == before and use_of_record(base) == use_of_record(before)
            r = sealed(r)
            base, base_json = r, encoded(r)
            r = drafted(r)
        klass = rng.choice(["", "standard", "spot", "reserved"])
        use = QuotaUse(
            cpus=rng.choice([0.25, 1, 2.5]), memory_mb=rng.randrange(64, 512), machines=1
        )
        request = f"r{step}"
        r = reserved(r, pending(request, use, klass=klass))
        assert excess(r, use, klass) is None
        kind = rng.random()
        if kind < 0.5:
            made += 1
            r = held(r, request, {f"m{made}": use})
        elif kind < 0.6 and r.held:
            r = held(r, request, {rng.choice(sorted(r.held)): use})  # an update's new size
        elif kind < 0.75:
            r = held(r, request, {}, {f"vol_w1_{step}": rng.randrange(1, 9)})
        elif kind < 0.9 and (r.held or r.volumes):
            r = held(r, request, {})
            r = released(r, rng.sample(sorted([*r.held, *r.volumes]), 1))
        again = QuotaRecord.model_validate_json(encoded(r))
        assert again == r
        assert use_of_record(again) == use_of_record(r)
        for c in ("reserved", "standard", "spot"):
            assert use_of_class(again, c) == use_of_class(r, c), (step, c)
    assert json.loads(encoded(r)) == json.loads(r.model_dump_json())
