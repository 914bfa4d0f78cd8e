"""What-if on a cluster as the broker lists it: the snapshot keeps what is allocated (GPU by
GPU), cordoned workers and the app's machines; a planned batch is placed one machine after the
other, each with the record a dry run gives."""

from __future__ import annotations

import pytest

from souq.errors import UnknownRegion
from souq.model import Placement, Resources, WorkerInfo, WorkerState
from souq.model.policy import PlacementPolicy
from souq.sim.whatif import Existing, Planned, batch, snapshot, what_if


def worker(
    worker_id: str,
    *,
    used: float = 0,
    cpus: float = 4,
    state: WorkerState = WorkerState.UP,
    gpus: int = 0,
    gpu_free: list[int] | None = None,
    region: str = "mad",
) -> WorkerInfo:
    return WorkerInfo(
        id=worker_id,
        region=region,
        state=state,
        capacity=Resources(cpus=cpus, memory_mb=4096, gpus=gpus, gpu_model="T4" if gpus else None),
        allocated=Resources(cpus=used, memory_mb=0),
        gpu_free=gpu_free or [],
    )


def one_cpu(count: int, app: str = "web") -> list[Planned]:
    return batch(app, "mad", Resources(cpus=1, memory_mb=256), count)


def test_a_full_worker_gets_nothing_and_the_batch_sees_its_own_machines() -> None:
    snap = snapshot([worker("full", used=4), worker("free")])
    outcome = what_if(snap, one_cpu(5))
    assert [v.worker for v in outcome.verdicts] == ["free"] * 4 + [None]
    assert [v.index for v in outcome.verdicts] == [1, 2, 3, 4, 5]
    assert (outcome.placed, outcome.unplaced, outcome.reasons()) == (4, 1, {"insufficient_cpu": 1})
    last = outcome.verdicts[-1]
    assert last.reason == "insufficient_cpu" and last.error is not None
    assert "no worker in region mad can take 1 cpus" in last.error
    # Each verdict carries the record a dry run gives: the winner, the offers, the rejections.
    first = outcome.verdicts[0].placement
    assert isinstance(first, Placement) and first.winner == "free" and first.policy == "best-fit"
    assert first.rejections == {"insufficient_cpu": 1}
    assert last.placement.rejections == {"insufficient_cpu": 2}
    assert snap.cluster.allocated("free").cpus == 4  # the snapshot, not the cluster, took them


def test_cordoned_and_draining_workers_stay_so_and_down_ones_are_left_out() -> None:
    workers = [
        worker("cordoned", state=WorkerState.CORDONED),
        worker("draining", state=WorkerState.DRAINING),
        worker("down", state=WorkerState.DOWN),
        worker("up", used=3),
    ]
    snap = snapshot(workers)
    assert snap.skipped == ["down"]
    assert sorted(snap.cluster.workers) == ["cordoned", "draining", "up"]
    outcome = what_if(snap, one_cpu(2))
    assert [v.worker for v in outcome.verdicts] == ["up", None]
    assert outcome.verdicts[1].placement.rejections == {
        "cordoned": 1,
        "draining": 1,
        "insufficient_cpu": 1,
    }
    assert outcome.as_json()["snapshot"] == {"workers": 3, "skipped": ["down"]}


def test_the_gpus_are_taken_in_gpu_by_gpu() -> None:
    snap = snapshot([worker("gpu", gpus=2, gpu_free=[0, 600])])
    admission = snap.cluster.workers["gpu"].admission
    assert admission.gpu_free() == (0, 600)
    assert admission.gpu_shapes() == {"1": 1, "share": 1}  # one whole GPU used, one shared
    share = Resources(cpus=0.5, memory_mb=64, gpu_milli=500)
    outcome = what_if(snap, batch("ml", "mad", share, 2))
    assert [v.worker for v in outcome.verdicts] == ["gpu", None]
    assert outcome.verdicts[0].placement.offers[0].gpu_free == [0, 600]
    assert outcome.reasons() == {"insufficient_gpu_share": 1}
    whole = what_if(snap, batch("ml", "mad", Resources(cpus=1, memory_mb=64, gpus=1), 1))
    assert whole.reasons() == {"insufficient_gpus": 1}


def test_a_group_with_services_is_spread_while_workers_have_room() -> None:
    workers = [worker("w1"), worker("w2"), worker("w3", used=3)]
    existing = [Existing("m1", "w1", "web", "mad", "app")]
    planned = [Planned("web", "mad", Resources(cpus=1, memory_mb=256), group="app", apart=True)] * 3
    outcome = what_if(snapshot(workers, machines=existing), planned)
    # Away from w1 (it runs one already), one each on w2 and w3, then sharing one again.
    assert [v.worker for v in outcome.verdicts[:2]] in (["w2", "w3"], ["w3", "w2"])
    assert outcome.verdicts[2].worker is not None and outcome.unplaced == 0


def test_the_policy_and_the_region_are_checked() -> None:
    workers = [worker("a"), worker("b")]
    spread = what_if(snapshot(workers, policy=PlacementPolicy(policy="spread")), one_cpu(2))
    assert {v.worker for v in spread.verdicts} == {"a", "b"}
    assert spread.verdicts[0].placement.policy == "spread"
    binpack = PlacementPolicy(policy="binpack")
    packed = what_if(snapshot(workers, policy=binpack), one_cpu(1, "x") + one_cpu(1, "y"))
    assert len({v.worker for v in packed.verdicts}) == 1
    # Two machines of one app: anti-affinity (the book counts the first) keeps them apart.
    apart = what_if(snapshot(workers, policy=binpack), one_cpu(2))
    assert len({v.worker for v in apart.verdicts}) == 2
    assert "anti-affinity" in apart.verdicts[1].placement.offers[0].scores
    with pytest.raises(UnknownRegion, match="'syd' is unknown; known regions: mad"):
        what_if(snapshot(workers), batch("web", "syd", Resources(cpus=1, memory_mb=1), 1))


def test_the_outcome_as_json() -> None:
    body = what_if(snapshot([worker("a", cpus=2)]), one_cpu(3)).as_json()
    assert (body["placed"], body["unplaced"], body["reasons"]) == (2, 1, {"insufficient_cpu": 1})
    first, _, third = body["machines"]
    assert first["worker"] == "a" and first["placement"]["winner"] == "a"
    assert first["resources"] == {"cpus": 1.0, "memory_mb": 256, "disk_mb": 0, "gpus": 0}
    assert third["worker"] is None and third["reason"] == "insufficient_cpu"
    assert third["placement"]["rejections"] == {"insufficient_cpu": 1}
