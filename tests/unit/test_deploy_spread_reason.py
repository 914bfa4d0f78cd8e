"""Why a deploy's region cannot spread a group: every worker there already runs one of its
machines, or a worker without one has no room. Pure."""

from __future__ import annotations

from souq.client.deploy_capacity import why_not_spread
from souq.model import Resources, WorkerInfo
from souq.model.worker import WorkerState


def worker(wid: str, region: str = "mad", state: WorkerState = WorkerState.UP) -> WorkerInfo:
    room = Resources(cpus=1, memory_mb=1024)
    return WorkerInfo(id=wid, region=region, state=state, capacity=room, allocated=room)


def test_every_worker_holding_a_sibling_is_not_said_to_lack_room() -> None:
    # `scale count 3` on two workers: both already run one of the group's machines.
    workers = [worker("w1"), worker("w2"), worker("s1", region="syd")]
    said = why_not_spread(workers, "mad", {"w1", "w2"})
    assert said == "every worker there (2) already runs one of its machines"


def test_a_worker_without_a_sibling_but_without_room_is_said_to_lack_room() -> None:
    said = why_not_spread([worker("w1"), worker("w2")], "mad", {"w1"})
    assert said == "no other worker there has room"


def test_a_worker_that_takes_no_machines_is_not_one_it_could_spread_to() -> None:
    workers = [
        worker("w1"),
        worker("w2", state=WorkerState.CORDONED),
        worker("w3", state=WorkerState.DOWN),
    ]
    assert why_not_spread(workers, "mad", {"w1"}).startswith("every worker there (1)")
