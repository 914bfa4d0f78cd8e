"""Durability: machines outlive their agent, a new agent re-adopts them, and unfinished
operations resume from the op log."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from pydantic import BaseModel

from souq.agent.state.events import Event
from souq.agent.state.operations import OpKind, OpState
from souq.agent.state.records import OpStep
from souq.agent.state.store import Store
from souq.bus.nats import NatsTransport, connect
from souq.errors import StorageError
from souq.model import (
    ClaimRequest,
    Machine,
    MachineConfig,
    MachineRef,
    MachineState,
    StopCommand,
    WaitCommand,
)
from souq.protocol import Verb, WorkerClient
from souq.protocol import verbs as v
from tests.integration.agent_harness import APP, eventually, pid_alive, running_agent

S = MachineState
SLEEPER = ["sleep", "60"]


class AgentChild:
    """``python -m souq agent`` as a child process."""

    def __init__(self, nats_url: str, data_dir: Path, *extra: str) -> None:
        self.log = data_dir.with_suffix(".log")
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as err:
            args = ["--region", "mad", "--nats", nats_url, "--data-dir", str(data_dir)]
            args += ["--cpus", "2", "--memory-mb", "1024", *extra]
            # Plain processes of the test's own user, as the harness's agents run them.
            args += ["--default-driver", "exec", "--machine-user", str(os.geteuid())]
            args += ["--allow-root-machines"] if os.geteuid() == 0 else []
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "souq", "agent", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        deadline = time.monotonic() + 20
        while True:
            text = self.log.read_text()[offset:]
            ready = [line for line in text.splitlines() if " ready in region " in line]
            if ready:
                self.ready_line = ready[0]
                self.worker_id = ready[0].split()[2]
                return
            assert self.proc.poll() is None, f"the agent exited: {text}"
            assert time.monotonic() < deadline, f"the agent is not ready: {text}"
            time.sleep(0.02)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(20)


async def ask(
    bus: NatsTransport, worker_id: str, verb: Verb[Any, Machine], msg: BaseModel
) -> Machine:
    return await WorkerClient(bus).call(worker_id, verb, msg, timeout=10)


def test_sigterm_leaves_machines_running_and_a_new_agent_adopts_them(
    nats_url: str, tmp_path: Path
) -> None:
    data_dir = tmp_path / "agent"
    first = AgentChild(nats_url, data_dir)
    assert (
        first.ready_line == f"souq agent {first.worker_id} ready in region mad (2 cpus, 1024 MiB)"
    )

    async def before() -> tuple[Machine, Machine]:
        bus = await connect(nats_url, name="test")
        try:
            machines = []
            for request_id in ("keep", "dies"):
                req = ClaimRequest(
                    request_id=request_id,
                    body_hash=request_id,
                    app=APP,
                    region="mad",
                    config=MachineConfig(cmd=SLEEPER),
                )
                machines.append(await ask(bus, first.worker_id, v.CLAIM, req))
            return machines[0], machines[1]
        finally:
            await bus.close()

    keep, dies = asyncio.run(before())
    assert first.terminate() == 0
    assert pid_alive(keep.pid or 0)
    assert pid_alive(dies.pid or 0)
    os.kill(dies.pid or 0, signal.SIGKILL)  # dies while no agent watches

    second = AgentChild(nats_url, data_dir, "--stop-machines-on-exit")
    assert second.worker_id == first.worker_id

    async def after() -> int:
        bus = await connect(nats_url, name="test")
        try:
            adopted = await ask(
                bus, second.worker_id, v.GET, MachineRef(app=APP, machine_id=keep.id)
            )
            assert (adopted.state, adopted.pid) == (S.STARTED, keep.pid)
            # The exit that happened meanwhile is reported; on-failure restarts it.
            cmd = WaitCommand(app=APP, machine_id=dies.id, state=S.STARTED, timeout_s=5)
            restarted = await ask(bus, second.worker_id, v.WAIT, cmd)
            assert restarted.pid != dies.pid
            exit_event = next(e for e in restarted.events if e.type == "exit")
            # souq-waiter kept its real status for the new agent.
            assert (exit_event.signal, exit_event.exit_code) == ("SIGKILL", None)
            assert (exit_event.message or "").startswith("killed by SIGKILL")
            # An adopted process stops like any other, and its status is known too.
            stop = StopCommand(app=APP, machine_id=keep.id)
            assert (await ask(bus, second.worker_id, v.STOP, stop)).state is S.STOPPING
            cmd = WaitCommand(app=APP, machine_id=keep.id, state=S.STOPPED, timeout_s=5)
            stopped = await ask(bus, second.worker_id, v.WAIT, cmd)
            assert stopped.events[0].type == "exit"
            assert stopped.events[0].signal == "SIGINT"  # the default stop signal
            assert not pid_alive(keep.pid or 0)
            assert restarted.pid is not None
            return restarted.pid
        finally:
            await bus.close()

    restarted_pid = asyncio.run(after())
    # --stop-machines-on-exit: nothing is left behind.
    assert second.terminate() == 0
    assert not pid_alive(restarted_pid)


def test_an_unfinished_stop_resumes_after_a_crash(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path, stop_machines_on_exit=False) as h:
            m = await h.claim(["sh", "-c", "trap 'exit 7' TERM; echo ready; sleep 60 & wait"])
            await h.output(m.id, "ready")
        assert m.pid is not None and pid_alive(m.pid)
        # As if the agent had logged "signalling" for a stop with SIGTERM, then crashed.
        store = Store(tmp_path)
        (row,) = store.load_machines()
        now = row.updated_at + 1
        store.commit(
            dataclasses.replace(row, state=S.STOPPING, updated_at=now),
            [],
            [
                OpStep(
                    "op-1",
                    m.id,
                    OpKind.STOP,
                    OpState.SIGNALLING,
                    Event.BEGIN,
                    now,
                    {"signal": "SIGTERM", "timeout_s": 5.0, "source": "user"},
                )
            ],
        )
        store.close()
        async with running_agent(nats_url, tmp_path) as h:
            stopped = await h.wait(m.id, S.STOPPED)
            assert stopped.events[0].type == "exit"
            assert not pid_alive(m.pid)
            steps = [(s.op_id, s.state, s.event) for s in h.agent.store.op_log(m.id)]
            assert steps[-3:] == [
                ("op-1", OpState.SIGNALLING, Event.BEGIN),
                ("op-1", OpState.SIGNALLING, Event.RECOVER),
                ("op-1", OpState.DONE, Event.EXITED),
            ]
            assert h.agent.store.unfinished_ops() == []

    asyncio.run(body())


def test_a_spawn_not_yet_recorded_is_adopted_not_repeated(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path, stop_machines_on_exit=False) as h:
            m = await h.claim(SLEEPER)
        # As if the agent had crashed between the Popen and the write that records it.
        store = Store(tmp_path)
        (row,) = store.load_machines()
        now = row.updated_at + 1
        store.commit(
            dataclasses.replace(row, state=S.STARTING, pid=None, pid_start_time=None),
            [],
            [OpStep("op-2", m.id, OpKind.START, OpState.SPAWNING, Event.BEGIN, now, {})],
        )
        store.close()
        async with running_agent(nats_url, tmp_path) as h:
            adopted = await h.get(m.id)
            assert (adopted.state, adopted.pid) == (S.STARTED, m.pid)
            assert adopted.events[0].message == "adopted after an agent restart"
            # No second process was spawned for it.
            assert _children_named("sleep", exclude=m.pid or 0) == []

    asyncio.run(body())


def test_a_restart_that_crashed_after_spawning_is_adopted(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path, stop_machines_on_exit=False) as h:
            m = await h.claim(SLEEPER)
        # As if a restart had logged its exit (machine stopped, op spawning), spawned the new
        # process, and crashed before recording it.
        store = Store(tmp_path)
        (row,) = store.load_machines()
        now = row.updated_at + 1
        store.commit(
            dataclasses.replace(row, state=S.STOPPED, pid=None, pid_start_time=None),
            [],
            [
                OpStep(
                    "op-3",
                    m.id,
                    OpKind.RESTART,
                    OpState.SPAWNING,
                    Event.EXITED,
                    now,
                    {"signal": "SIGINT", "timeout_s": 5.0, "source": "user", "type": "restart"},
                )
            ],
        )
        store.close()
        async with running_agent(nats_url, tmp_path) as h:
            adopted = await h.get(m.id)
            assert (adopted.state, adopted.pid) == (S.STARTED, m.pid)
            assert [(e.type, e.status) for e in adopted.events[:2]] == [
                ("restart", S.STARTED),
                ("start", S.STARTING),
            ]
            assert h.agent.store.unfinished_ops() == []

    asyncio.run(body())


def _children_named(name: str, *, exclude: int) -> list[int]:
    found = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):  # one that ended meanwhile is not one of them
            if p.name() == name and p.pid != exclude and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
    return found


def test_the_data_dir_is_locked_and_the_worker_id_kept(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            worker_id = h.worker_id
            with pytest.raises(StorageError, match="another agent"):
                Store(tmp_path)
        async with running_agent(nats_url, tmp_path) as h:
            assert h.worker_id == worker_id

    asyncio.run(body())


def test_no_op_is_left_unfinished_in_normal_use(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            m = await h.claim(SLEEPER)
            await h.call(v.RESTART, StopCommand(app=APP, machine_id=m.id))
            await h.call(v.STOP, StopCommand(app=APP, machine_id=m.id))
            await eventually(lambda: not h.agent.store.unfinished_ops(), message="ops to finish")
            kinds = {(s.kind, s.state) for s in h.agent.store.op_log(m.id)}
            assert (OpKind.CREATE, OpState.DONE) in kinds
            assert (OpKind.RESTART, OpState.DONE) in kinds
            assert (OpKind.STOP, OpState.DONE) in kinds

    asyncio.run(body())
