"""The broker's use cases against fake workers: routing commands to the owning worker, listing,
waiting, logs."""

from __future__ import annotations

import asyncio

import pytest

from souq.broker.machine_logs import follow_logs
from souq.broker.service import BrokerService
from souq.bus import MemoryTransport
from souq.errors import IllegalTransition, NotFound, Unavailable, WaitTimeout
from souq.model import MachineState, StopCommand, WaitCommand

from .broker_fakes import FakeWorker, broker_config, create_body, started_service

pytestmark = pytest.mark.anyio


async def two_workers() -> tuple[MemoryTransport, FakeWorker, FakeWorker, BrokerService]:
    bus = MemoryTransport()
    a, b = FakeWorker(bus, "wa"), FakeWorker(bus, "wb")
    service = await started_service(bus, a, b)
    return bus, a, b, service


async def test_commands_go_to_the_worker_that_owns_the_machine() -> None:
    _, a, b, service = await two_workers()
    m = await service.create_machine("web", create_body())
    owner = a if m.worker_id == "wa" else b
    assert service.directory.cached(m.id) == owner.id

    assert (await service.get_machine("web", m.id)).id == m.id
    cmd = StopCommand(app="web", machine_id=m.id, signal="SIGTERM", timeout_s=1)
    stopped = await service.stop_machine(cmd)
    assert stopped.state == MachineState.STOPPED
    assert (await service.start_machine("web", m.id)).state == MachineState.STARTED
    with pytest.raises(IllegalTransition):
        await service.destroy_machine("web", m.id)
    gone = await service.destroy_machine("web", m.id, force=True)
    assert gone.state == MachineState.DESTROYED
    assert owner.allocated.millicpus == 0


async def test_a_broker_that_never_saw_the_machine_locates_it() -> None:
    bus, *_, first = await two_workers()
    m = await first.create_machine("web", create_body())
    other = BrokerService(bus, broker_config())
    await other.start()
    assert await other.liveness.wait_workers(2, timeout=5)
    assert other.directory.cached(m.id) is None
    assert (await other.get_machine("web", m.id)).worker_id == m.worker_id
    assert other.directory.cached(m.id) == m.worker_id


async def test_an_unknown_machine_is_not_found_naming_its_id() -> None:
    *_, service = await two_workers()
    with pytest.raises(NotFound, match="0123456789abcd"):
        await service.get_machine("web", "0123456789abcd")


async def test_a_machine_of_another_app_is_not_found() -> None:
    *_, service = await two_workers()
    m = await service.create_machine("web", create_body())
    with pytest.raises(NotFound):
        await service.get_machine("api", m.id)


async def test_machine_events_fill_the_route_cache() -> None:
    bus, a, b, service = await two_workers()
    other = BrokerService(bus, broker_config())
    await other.start()
    m = await service.create_machine("web", create_body())
    owner = a if m.worker_id == "wa" else b
    await owner.set_state(m.id, MachineState.STOPPED)  # publishes a machine event
    for _attempt in range(100):
        if other.directory.cached(m.id):
            break
        await asyncio.sleep(0)
    assert other.directory.cached(m.id) == m.worker_id


async def test_list_merges_every_worker_and_leaves_out_other_apps() -> None:
    *_, service = await two_workers()
    made = [await service.create_machine("web", create_body(cpus=2)) for _ in range(3)]
    await service.create_machine("api", create_body())
    listed = await service.list_machines("web")
    assert sorted(m.id for m in listed) == sorted(m.id for m in made)
    assert {m.worker_id for m in listed} == {"wa", "wb"}
    assert await service.list_machines("nothing") == []


async def test_wait_returns_once_the_state_is_reached_or_times_out() -> None:
    _, a, b, service = await two_workers()
    m = await service.create_machine("web", create_body())
    owner = a if m.worker_id == "wa" else b
    stopped = WaitCommand(app="web", machine_id=m.id, state=MachineState.STOPPED, timeout_s=5)
    with pytest.raises(WaitTimeout) as caught:
        await service.wait(stopped.model_copy(update={"timeout_s": 0.01}))
    assert caught.value.http_status == 408
    waiting = asyncio.ensure_future(service.wait(stopped))
    await owner.set_state(m.id, MachineState.STOPPED)
    assert (await waiting).state == MachineState.STOPPED


async def test_logs_are_read_to_the_end_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from souq.broker import machine_logs

    monkeypatch.setattr(machine_logs, "LOGS_CHUNK_BYTES", 4)
    _, a, b, service = await two_workers()
    m = await service.create_machine("web", create_body())
    owner = a if m.worker_id == "wa" else b
    owner.write("hello\nworld\n")
    assert await machine_logs.logs(service, "web", m.id) == "hello\nworld\n"


async def test_follow_yields_new_output_until_the_machine_is_destroyed() -> None:
    _, a, b, service = await two_workers()
    m = await service.create_machine("web", create_body())
    owner = a if m.worker_id == "wa" else b
    owner.write("one\n")
    stream = follow_logs(service, "web", m.id)
    assert await anext(stream) == "one\n"
    pending = asyncio.ensure_future(anext(stream))
    owner.write("two\n")
    assert await pending == "two\n"
    await owner.set_state(m.id, MachineState.DESTROYED)
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_a_worker_that_went_away_makes_its_machines_unavailable() -> None:
    _, a, b, service = await two_workers()
    m = await service.create_machine("web", create_body())
    owner = a if m.worker_id == "wa" else b
    await owner.stop()
    with pytest.raises(Unavailable, match=f"worker {owner.id}"):
        await service.get_machine("web", m.id)


async def test_the_bus_being_down_is_unavailable() -> None:
    bus, *_, service = await two_workers()
    bus.connected_flag = False
    assert not service.connected
    with pytest.raises(Unavailable):
        await service.create_machine("web", create_body())
    with pytest.raises(Unavailable):
        await service.list_machines("web")
