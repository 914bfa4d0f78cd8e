"""Helpers for the agent's integration tests: a real agent in this event loop, a real
nats-server, and a bus connection playing the broker."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from souq.agent.config import AgentConfig
from souq.agent.main import Agent
from souq.bus.nats import NatsTransport, connect
from souq.ids import new_request_id
from souq.model import (
    ClaimRequest,
    LogsCommand,
    LogsReply,
    Machine,
    MachineConfig,
    MachineRef,
    MachineState,
    WaitCommand,
)
from souq.protocol import Verb, WorkerClient
from souq.protocol import verbs as v
from souq.testing import STARTED_WORKERS, eventually

APP = "demo"
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Q = TypeVar("Q", bound=BaseModel)
A = TypeVar("A")


def load(model: type[M], result: Any) -> M:
    """A model from a reply's result, validated as JSON (as it travelled)."""
    return model.model_validate_json(json.dumps(result))


@dataclass
class Harness:
    agent: Agent
    bus: NatsTransport

    @property
    def worker_id(self) -> str:
        return self.agent.worker_id

    async def call(self, verb: Verb[Q, A], msg: Q, timeout: float = 10.0) -> A:
        """Send ``verb`` to the agent as a broker does (:class:`WorkerClient`)."""
        return await WorkerClient(self.bus).call(self.worker_id, verb, msg, timeout=timeout)

    async def claim(
        self,
        cmd: list[str],
        *,
        app: str = APP,
        request_id: str | None = None,
        body_hash: str | None = None,
        skip_launch: bool = False,
        name: str | None = None,
        cpus: float = 1,
        memory_mb: int = 256,
        **config: Any,
    ) -> Machine:
        """Claim a machine the way a broker does. ``config`` takes MachineConfig fields."""
        body = {"cmd": cmd, "guest": {"cpus": cpus, "memory_mb": memory_mb}, **config}
        mc = MachineConfig.model_validate_json(json.dumps(body))
        req = ClaimRequest(
            request_id=request_id or new_request_id(),
            body_hash=body_hash or hashlib.sha256(mc.model_dump_json().encode()).hexdigest(),
            app=app,
            name=name,
            region=self.agent.config.region,
            config=mc,
            skip_launch=skip_launch,
        )
        return await self.call(v.CLAIM, req)

    async def get(self, machine_id: str, app: str = APP) -> Machine:
        return await self.call(v.GET, MachineRef(app=app, machine_id=machine_id))

    async def wait(self, machine_id: str, state: MachineState, timeout_s: float = 5.0) -> Machine:
        cmd = WaitCommand(app=APP, machine_id=machine_id, state=state, timeout_s=timeout_s)
        return await self.call(v.WAIT, cmd, timeout=timeout_s + 5)

    async def logs(self, machine_id: str, offset: int = 0, wait_s: float = 0.0) -> LogsReply:
        cmd = LogsCommand(app=APP, machine_id=machine_id, offset=offset, wait_s=wait_s)
        return await self.call(v.LOGS, cmd, timeout=wait_s + 5)

    async def output(self, machine_id: str, contains: str, timeout: float = 5.0) -> str:
        """The machine's output once it contains ``contains``."""

        async def probe() -> str:
            text = (await self.logs(machine_id)).data
            return text if contains in text else ""

        return await eventually(probe, timeout=timeout, message=f"{contains!r} in the output")


@contextlib.asynccontextmanager
async def running_agent(nats_url: str, data_dir: Path, **settings: Any) -> AsyncIterator[Harness]:
    settings.setdefault("region", "mad")
    settings.setdefault("cpus", 4)
    settings.setdefault("memory_mb", 4096)
    settings.setdefault("heartbeat_interval_s", 0.2)
    settings.setdefault("stop_machines_on_exit", True)
    settings.setdefault("restart_backoff_base_s", 0.05)
    # Machines run as the test's own user (its files and interpreter are that user's), as
    # with souq.testing.AgentProcess; tests of the default user pass machine_user=None.
    settings.setdefault("machine_user", str(os.geteuid()))
    settings.setdefault("allow_root_machines", True)
    settings.setdefault("default_driver", "exec")  # tests of isolation ask for the default
    agent = Agent(AgentConfig(nats_url=nats_url, data_dir=data_dir, **settings))
    await agent.start()
    STARTED_WORKERS.add(agent.worker_id)  # what its private network leaves, swept at the end
    bus = await connect(nats_url, name="test-broker")
    try:
        yield Harness(agent, bus)
    finally:
        await bus.close()
        await agent.aclose()


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
