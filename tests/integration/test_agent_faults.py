"""Crash the agent at every step of every operation (``souq.agent.machines.faults``): right after
the step is in the op log and before its actions run. After a restart on the same data dir every
machine ends in a consistent state, no reservation leaks and no process is lost or doubled.

The steps come from the operation tables, so a new step is covered without touching this file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from pydantic import BaseModel

from souq.agent.state.operations import TABLES, OpKind, OpState
from souq.bus.nats import NatsTransport, connect
from souq.ids import new_request_id
from souq.model import (
    ClaimRequest,
    DestroyCommand,
    Machine,
    MachineConfig,
    MachineRef,
    MachineState,
    SignalCommand,
    StopCommand,
)
from souq.model.protocol import CordonCommand
from souq.natsserver import NatsServer
from souq.protocol import Verb, WorkerClient
from souq.protocol import verbs as v
from souq.testing import AgentProcess, environment, eventually

S = MachineState
APP = "faults"
STEPS = sorted(
    {(kind, step.next) for kind, table in TABLES.items() for step in table.values()}
    - {(kind, OpState.NEW) for kind in OpKind}
)
# The final state each operation leaves its machine in.
FINAL = {
    OpKind.CREATE: S.STARTED,
    OpKind.START: S.STARTED,
    OpKind.STOP: S.STOPPED,
    OpKind.RESTART: S.STARTED,
    OpKind.SIGNAL: S.STARTED,
    OpKind.DESTROY: S.DESTROYED,
}
STABLE = {S.CREATED, S.STARTED, S.STOPPED, S.DESTROYED}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    root = tmp_path_factory.mktemp("faults")
    with NatsServer() as nats, environment(SOUQ_FAULT_INJECTION="1"):
        agent = AgentProcess(
            region="mad", nats_url=nats.url, data_dir=root / "agent", cpus=64, memory_mb=65536
        )
        agent.start()
        try:
            yield agent
        finally:
            agent.stop()


async def ask(bus: NatsTransport, worker_id: str, verb: Verb[Any, Any], msg: BaseModel) -> Any:
    return await WorkerClient(bus).call(worker_id, verb, msg, timeout=10)


def claim(skip_launch: bool = False, *, serves: bool = False) -> ClaimRequest:
    """``serves``: the machine has a service, so that its stop drains first."""
    rid = new_request_id()
    services = [{"internal_port": 8080}] if serves else []
    stop = {"drain_s": 0.2} if serves else {}
    return ClaimRequest(
        request_id=rid,
        body_hash=rid,
        app=APP,
        region="mad",
        config=MachineConfig.model_validate(
            {"cmd": ["sleep", "60"], "services": services, "stop_config": stop}
        ),
        skip_launch=skip_launch,
    )


def command(kind: OpKind, state: OpState, machine: Machine) -> tuple[Verb[Any, Any], BaseModel]:
    """The verb and message that run ``kind`` on ``machine`` through ``state``."""
    ref = {"app": APP, "machine_id": machine.id}
    # SIGCONT leaves sleep running, so the stop times out and the kill step is reached.
    slow = {"signal": "SIGCONT", "timeout_s": 0.2} if state is OpState.KILLING else {}
    if kind is OpKind.START:
        return v.START, MachineRef(**ref)
    if kind in (OpKind.STOP, OpKind.RESTART):
        return v.VERBS[str(kind)], StopCommand(**ref, **slow)
    if kind is OpKind.SIGNAL:
        return v.SIGNAL, SignalCommand(**ref, signal="SIGCONT")
    if state in (OpState.DRAINING, OpState.SIGNALLING):  # a graceful destroy: stop first
        return v.DESTROY, DestroyCommand(**ref, graceful=True)
    return v.DESTROY, DestroyCommand(**ref, force=True)


def sleepers(agent: AgentProcess, machine_id: str) -> list[int]:
    """The machine's own processes (sleep, run in its directory)."""
    where = str(agent.data_dir / "machines" / machine_id)
    found = []
    for p in psutil.process_iter(["name", "cwd", "status"]):
        info = p.info
        if info["name"] == "sleep" and info["cwd"] == where and info["status"] != "zombie":
            found.append(p.pid)
    return found


@pytest.mark.parametrize(("kind", "state"), STEPS, ids=[f"{k}:{s}" for k, s in STEPS])
def test_a_crash_after_each_step_recovers(
    agent: AgentProcess, kind: OpKind, state: OpState
) -> None:
    fault = agent.data_dir / "fault"

    async def crash() -> Machine | None:
        bus = await connect(agent.nats_url, name="test")
        try:
            assert agent.worker_id is not None
            if kind is OpKind.CREATE:
                before = None
                fault.write_text(f"{kind}:{state}")
                verb, msg = v.CLAIM, claim()
            else:
                serves = state is OpState.DRAINING
                start = claim(skip_launch=kind is OpKind.START, serves=serves)
                before = await ask(bus, agent.worker_id, v.CLAIM, start)
                fault.write_text(f"{kind}:{state}")
                verb, msg = command(kind, state, before)
            request = asyncio.ensure_future(ask(bus, agent.worker_id, verb, msg))
            assert agent.process is not None
            proc = agent.process
            for _ in range(500):  # the agent dies at the step: no reply ever comes
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.02)
            request.cancel()
            assert proc.poll() == 137, "the fault did not fire"
            assert not fault.exists()
            return before
        finally:
            await bus.close()

    before = asyncio.run(crash())
    agent.process = None
    agent.start()

    async def check() -> None:
        bus = await connect(agent.nats_url, name="test")
        try:
            assert agent.worker_id is not None
            wid = agent.worker_id
            if before is None:  # the crashed claim's machine: the only one not destroyed
                (mid,) = [x.id for x in await list_machines(bus) if x.state is not S.DESTROYED]
            else:
                mid = before.id

            async def settled() -> Machine | None:
                m = await ask(bus, wid, v.GET, MachineRef(app=APP, machine_id=mid))
                return m if m.state is FINAL[kind] else None

            m = await eventually(settled, message=f"the machine {FINAL[kind]}")
            # Exactly one process per started machine, and it is the recorded one. A process
            # settles a moment after its state: a new one runs `sh` (its cgroup wrapper) until it
            # execs `sleep`, and a killed one takes a moment to exit.
            want = [m.pid] if m.state is S.STARTED else []
            await eventually(
                lambda: sleepers(agent, m.id) == want, timeout=5, message=f"processes {want}"
            )
            if m.state is S.STARTED and kind is OpKind.RESTART:
                assert before is not None
                assert m.pid != before.pid
            # No reservation leaks: allocated is the sum of the live machines' guests.
            info = await ask(bus, wid, v.CORDON, CordonCommand(cordoned=False))
            live = [x for x in await list_machines(bus) if x.state is not S.DESTROYED]
            assert info.allocated.cpus == pytest.approx(sum(x.config.guest.cpus for x in live))
            assert info.allocated.memory_mb == sum(x.config.guest.memory_mb for x in live)
            for x in live:
                assert x.state in STABLE, f"{x.id} is {x.state}"
            # Leave nothing running for the next case.
            if m.state is not S.DESTROYED:
                await ask(bus, wid, v.DESTROY, DestroyCommand(app=APP, machine_id=m.id, force=True))
        finally:
            await bus.close()

    asyncio.run(check())


async def list_machines(bus: NatsTransport) -> list[Machine]:
    from souq.model.protocol import ListCommand

    replies = await WorkerClient(bus).ask_all(v.LIST, ListCommand(app=APP), expect=1, timeout=5)
    return [m for r in replies for m in r]


def test_every_step_is_covered() -> None:
    assert (OpKind.RESTART, OpState.KILLING) in STEPS
    assert len(STEPS) >= 14
