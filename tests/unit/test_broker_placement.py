"""The broker places with the create's policy laid over its own defaults, honours constraints,
and names an unmet constraint when nothing can take the machine."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from souq.bus import MemoryTransport
from souq.errors import InsufficientCapacity
from souq.model import Placement, Resources

from .broker_fakes import FakeWorker, create_body, started_service

pytestmark = pytest.mark.anyio

SSD = {"attribute": "label.disk", "operator": "=", "value": "ssd"}


def with_config(**config: object) -> dict[str, object]:
    return {"config": {"cmd": ["sleep", "60"], "guest": {"cpus": 1, "memory_mb": 256}, **config}}


async def test_a_label_constraint_steers_placement() -> None:
    bus = MemoryTransport()
    hdd = FakeWorker(
        bus, "whdd", labels={"disk": "hdd"}, allocated=Resources(cpus=2, memory_mb=2048)
    )
    ssd = FakeWorker(bus, "wssd", labels={"disk": "ssd"})
    service = await started_service(bus, hdd, ssd)

    for _ in range(3):
        machine = await service.create_machine("web", create_body(**with_config(constraints=[SSD])))
        assert machine.worker_id == "wssd"
        record = machine.placement
        assert record is not None
        assert record.rejections == {"constraint": 1}
        assert record.unmet == {"constraint": ["label.disk = ssd"]}
        rejected = next(o for o in record.offers if o.rejected)
        assert rejected.detail == "label.disk = ssd: the worker has label.disk = hdd"


async def test_an_unsatisfiable_constraint_is_named_in_the_refusal() -> None:
    bus = MemoryTransport()
    workers = [FakeWorker(bus, f"w{i}", labels={"disk": "hdd"}) for i in range(2)]
    service = await started_service(bus, *workers)

    with pytest.raises(InsufficientCapacity) as caught:
        await service.create_machine("web", create_body(**with_config(constraints=[SSD])))

    err = caught.value
    assert err.http_status == 409
    assert err.message == (
        "no worker in region mad can take 1 cpus / 256 MiB: 2 constraint (label.disk = ssd)"
    )
    assert err.hint is not None and "constraint" in err.hint
    record = Placement.model_validate(err.details["placement"])
    assert record.unmet == {"constraint": ["label.disk = ssd"]}
    assert all(w.claims == [] for w in workers)


async def test_distinct_workers_for_app_spreads_then_refuses() -> None:
    bus = MemoryTransport()
    workers = [FakeWorker(bus, f"w{i}") for i in range(2)]
    service = await started_service(bus, *workers)
    body = create_body(**with_config(distinct_workers_for="app"))

    first = await service.create_machine("web", body)
    second = await service.create_machine("web", body)
    assert {first.worker_id, second.worker_id} == {"w0", "w1"}
    with pytest.raises(InsufficientCapacity) as caught:
        await service.create_machine("web", body)
    assert "2 distinct_workers (distinct_workers_for: app)" in caught.value.message
    # Another app is not held back.
    assert (await service.create_machine("api", body)).worker_id in {"w0", "w1"}


async def test_the_create_chooses_the_policy_over_the_brokers_default() -> None:
    bus = MemoryTransport()
    fuller = FakeWorker(bus, "wfull", allocated=Resources(cpus=2.5, memory_mb=2560))
    empty = FakeWorker(bus, "wempty")
    service = await started_service(bus, fuller, empty)

    spread = await service.create_machine(
        "web", create_body(placement={"policy": "spread", "weights": {"anti-affinity": 0}})
    )
    assert spread.worker_id == "wempty"
    assert spread.placement is not None
    assert spread.placement.policy == "spread"
    assert spread.placement.weights == {"spread": 1.0, "load": 0.25, "cache": 1.0}
    packed = await service.create_machine("web", create_body(placement={"policy": "binpack"}))
    assert packed.worker_id == "wfull"
    assert packed.placement is not None and packed.placement.policy == "binpack"


async def test_the_brokers_default_policy_applies_when_the_create_names_none() -> None:
    bus = MemoryTransport()
    fuller = FakeWorker(bus, "wfull", allocated=Resources(cpus=2.5, memory_mb=2560))
    empty = FakeWorker(bus, "wempty")
    service = await started_service(bus, fuller, empty, placement={"policy": "spread"})

    machine = await service.create_machine("web", create_body())
    assert machine.worker_id == "wempty"
    assert machine.placement is not None and machine.placement.policy == "spread"


async def test_a_bad_policy_is_refused_before_anything_is_asked() -> None:
    with pytest.raises(ValidationError, match="unknown scorer 'fast'"):
        create_body(placement={"weights": {"fast": 1}})
    with pytest.raises(ValidationError, match="does not compile"):
        create_body(
            **with_config(
                constraints=[{"attribute": "label.a", "operator": "regexp", "value": "("}]
            )
        )
