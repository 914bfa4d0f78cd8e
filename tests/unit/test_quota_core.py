"""The quota core (souq.model.quota), pure: what a ledger admits, how a create's reservation
settles, and what reconciliation does with a dead broker's reservation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from souq.model.quota import (
    BATCH_MARK,
    ClusterMachine,
    QuotaEntry,
    QuotaLimits,
    QuotaRecord,
    QuotaUse,
    excess,
    held,
    reconciled,
    released,
    reserved,
    use_of_record,
)

ONE = QuotaUse(cpus=1, memory_mb=256, machines=1)


def record(**limits: float) -> QuotaRecord:
    return QuotaRecord(scope="app", name="web", limits=QuotaLimits(**limits))  # type: ignore[arg-type]


def pending(request_id: str, use: QuotaUse = ONE, deadline_ms: int = 1_000) -> QuotaEntry:
    return QuotaEntry(app="web", request_id=request_id, use=use, deadline_ms=deadline_ms)


def machine(machine_id: str, request_id: str, *, destroyed: bool = False) -> ClusterMachine:
    return ClusterMachine(machine_id, "web", request_id, ONE, destroyed)


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


@pytest.mark.parametrize("body", [{"machines": -1}, {"cpus": "4"}, {"memory_mb": 1.5}, {"x": 1}])
def test_bad_limits_are_refused(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        QuotaLimits.model_validate(body)
