"""The hollow fleet: N simulated workers in one process, speaking the real protocol over real
NATS (as kubemark's hollow nodes do for Kubernetes), so that scale can be measured on one host.

Each hollow worker is a real :class:`~souq.agent.main.Agent` (store, executor, operations,
commands, service: the same code paths as ``souq agent``) with three things swapped:

* the driver is :class:`~souq.fleet.driver.HollowDriver` (no process is started);
* the store is SQLite ``:memory:`` (or one file per worker with ``synchronous=OFF`` under
  ``--data-dir``), see :mod:`souq.fleet.store`;
* the transport is a :class:`~souq.fleet.bus.WorkerPort` on one shared NATS connection;

and they share what one host needs once: its load gauge, and one publishing schedule
(:class:`~souq.fleet.pacer.FleetPacer`: heartbeats and machine events without a task per
worker).

Heartbeats come every ``max(1, N / 500)`` seconds, so that the whole fleet sends about 500 a
second whatever its size (each one costs every broker a decode).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from souq import daemon
from souq.agent.capacity.load import LoadGauge
from souq.agent.config import AgentConfig, Region
from souq.agent.main import Agent
from souq.auth.bus import daemon_credential
from souq.bus.nats import NatsTransport, connect
from souq.clock import SystemClock
from souq.fleet.bus import FleetBus
from souq.fleet.driver import HollowDriver
from souq.fleet.heap import SurvivorFreezer
from souq.fleet.jobs import HollowJobProcesses
from souq.fleet.pacer import FleetPacer
from souq.fleet.store import file_store, memory_store

__all__ = ["Fleet", "FleetConfig", "run"]

log = logging.getLogger(__name__)

HEARTBEATS_PER_S = 500  # the whole fleet's heartbeat rate


class FleetConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    nats_url: str
    auth_dir: Path | None = Field(
        default=None, description="the cluster's auth directory (souq cluster init)"
    )
    region: Region
    workers: int = Field(ge=1, le=100_000)
    cpus: float = Field(default=4.0, gt=0, description="each worker offers this many")
    memory_mb: int = Field(default=8192, gt=0, description="each worker offers this much")
    jobs: int = Field(
        default=0, ge=0, le=64, description="batch jobs each worker runs at once (hollow runs)"
    )
    data_dir: Path | None = Field(
        default=None, description="one state file per worker; default: in memory"
    )
    heartbeat_interval_s: float | None = Field(
        default=None, gt=0, description="default: max(1, workers / 500)"
    )

    @property
    def interval_s(self) -> float:
        if self.heartbeat_interval_s is not None:
            return self.heartbeat_interval_s
        return max(1.0, self.workers / HEARTBEATS_PER_S)


class Fleet:
    """``await start()``, then ``await aclose()``. Pass a ``transport`` to share a connection
    you own; otherwise the fleet connects to ``config.nats_url``."""

    def __init__(self, config: FleetConfig, *, transport: NatsTransport | None = None) -> None:
        self.config = config
        self._transport = transport
        self._own_transport = transport is None
        self._bus: FleetBus | None = None
        self.driver = HollowDriver()
        self.load = LoadGauge(SystemClock())  # one host: its load, read once for every worker
        self._pacer: FleetPacer | None = None
        self.agents: list[Agent] = []

    @property
    def worker_ids(self) -> list[str]:
        return [a.worker_id for a in self.agents]

    async def start(self) -> None:
        config = self.config
        try:
            if self._transport is None:
                self._transport = await connect(
                    config.nats_url,
                    name="souq-fleet",
                    credential=daemon_credential(config.auth_dir, "fleet"),
                )
            self._bus = FleetBus(self._transport)
            await self._bus.start()
            self._pacer = FleetPacer(interval_s=config.interval_s)
            self._pacer.start()
            for n in range(config.workers):
                await self._add(n)
            await self._bus.flush()
        except BaseException:
            await self.aclose()
            raise
        log.info("fleet ready: %d workers in region %s", len(self.agents), config.region)

    async def _add(self, n: int) -> None:
        assert self._bus is not None
        assert self._pacer is not None
        config = self.config
        data_dir = config.data_dir / f"{config.region}-{n:05d}" if config.data_dir else None
        agent_config = AgentConfig(
            region=config.region,
            nats_url=config.nats_url,
            cpus=config.cpus,
            memory_mb=config.memory_mb,
            heartbeat_interval_s=config.interval_s,
            jobs=config.jobs,
            **({"data_dir": data_dir} if data_dir else {}),
        )
        agent = Agent(
            agent_config,
            transport=self._bus.port(),
            store=file_store(data_dir) if data_dir else memory_store(),
            driver=self.driver,
            load=self.load,
            pacer=self._pacer,
            hollow_jobs=(
                (self._bus.transport.client, HollowJobProcesses()) if self.config.jobs else None
            ),
        )
        await agent.start()
        self.agents.append(agent)

    async def aclose(self) -> None:
        for agent in self.agents:
            await agent.aclose()
        self.agents = []
        if self._pacer is not None:
            await self._pacer.aclose()
            self._pacer = None
        if self._bus is not None:
            await self._bus.close()
            self._bus = None
        if self._transport is not None and self._own_transport:
            await self._transport.close()
            self._transport = None

    def ready_line(self) -> str:
        return f"souq fleet ready: {len(self.agents)} workers in region {self.config.region}"


def run(config: FleetConfig) -> None:
    """Run a fleet in the foreground until SIGINT or SIGTERM (blocking). Prints one line to
    stderr when ready: ``souq fleet ready: N workers in region R``."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        fleet = Fleet(config)
        await fleet.start()
        heap = SurvivorFreezer()  # the workers' state, and every machine they make (heap.py)
        heap.install()
        print(fleet.ready_line(), file=sys.stderr, flush=True)
        try:
            await stop.wait()
        finally:
            heap.uninstall()
            await fleet.aclose()

    daemon.run(main())
