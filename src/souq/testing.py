"""Test helpers, shipped with Souq so that users can test against a real cluster too.

:class:`Cluster` starts a real nats-server, real ``souq agent`` processes and real ``souq broker``
processes on loopback ports; :func:`wait_until` waits on a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import httpx
import psutil

from souq.client.api import SouqClient
from souq.dev import start_agent_process
from souq.natsserver import NatsServer, free_port
from souq.procs import terminate

__all__ = ["AgentProcess", "BrokerProcess", "Cluster", "FleetProcess", "wait_until"]

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float = 10.0,
    interval: float = 0.01,
    message: str = "condition",
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that; raise
    ``TimeoutError`` naming ``message`` once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {message}")
        time.sleep(interval)


class AgentProcess:
    """One ``souq agent`` child process."""

    def __init__(
        self,
        *,
        region: str,
        nats_url: str,
        data_dir: Path,
        cpus: float | None = None,
        memory_mb: int | None = None,
        labels: Mapping[str, str] | None = None,
        stop_machines_on_exit: bool = True,
        heartbeat_interval_s: float | None = None,
    ) -> None:
        self.region = region
        self.heartbeat_interval_s = heartbeat_interval_s
        self.nats_url = nats_url
        self.data_dir = data_dir
        self.cpus = cpus
        self.memory_mb = memory_mb
        self.labels = dict(labels or {})
        self.stop_machines_on_exit = stop_machines_on_exit
        self.log_path = data_dir.with_name(data_dir.name + ".log")
        self.process: subprocess.Popen[bytes] | None = None
        self.worker_id: str | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "the agent is not running"
        return self.process.pid

    def start(self, timeout: float = 30.0) -> None:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.process = start_agent_process(
            region=self.region,
            nats_url=self.nats_url,
            data_dir=self.data_dir,
            cpus=self.cpus,
            memory_mb=self.memory_mb,
            labels=self.labels,
            stop_machines_on_exit=self.stop_machines_on_exit,
            log_path=self.log_path,
            heartbeat_interval_s=self.heartbeat_interval_s,
        )

        def ready() -> str | None:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"agent exited at start: {self.log_tail()}")
            text = self.log_path.read_text(errors="replace")[offset:]
            for line in text.splitlines():
                words = line.split()
                if len(words) >= 4 and words[:2] == ["souq", "agent"] and words[3] == "ready":
                    return words[2]
            return None

        self.worker_id = wait_until(ready, timeout=timeout, message="the agent to be ready")

    def log_tail(self, chars: int = 2000) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def machine_pids(self) -> list[int]:
        """Pids of the agent's descendants (its machines' processes)."""
        if self.process is None or self.process.poll() is not None:
            return []
        with contextlib.suppress(psutil.Error):
            return [p.pid for p in psutil.Process(self.process.pid).children(recursive=True)]
        return []

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        proc = self.process
        if proc is None:
            return None
        terminate(proc, sig=sig, timeout=timeout)
        self.process = None
        return proc.returncode

    def kill(self) -> None:
        """Kill -9: a crash."""
        self.stop(signal.SIGKILL)


class FleetProcess:
    """One ``souq fleet`` child process: ``workers`` hollow workers in ``region``."""

    def __init__(
        self,
        *,
        nats_url: str,
        region: str,
        workers: int,
        log_path: Path,
        cpus: float | None = None,
        memory_mb: int | None = None,
    ) -> None:
        self.nats_url = nats_url
        self.region = region
        self.workers = workers
        self.log_path = log_path
        self.cpus = cpus
        self.memory_mb = memory_mb
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "the fleet is not running"
        return self.process.pid

    def start(self, timeout: float = 120.0) -> None:
        args = [sys.executable, "-m", "souq", "fleet", "--nats", self.nats_url]
        args += ["--workers", str(self.workers), "--region", self.region]
        if self.cpus is not None:
            args += ["--cpus", str(self.cpus)]
        if self.memory_mb is not None:
            args += ["--memory-mb", str(self.memory_mb)]
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as err:
            self.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
            )

        def ready() -> bool:
            assert self.process is not None
            text = self.log_path.read_text(errors="replace")[offset:]
            if self.process.poll() is not None:
                raise RuntimeError(f"fleet exited at start: {text[-2000:]}")
            return "souq fleet ready:" in text

        wait_until(ready, timeout=timeout, interval=0.05, message="the fleet to be ready")

    def stop(self, timeout: float = 60.0) -> None:
        proc = self.process
        if proc is None:
            return
        terminate(proc, timeout=timeout)
        self.process = None


class BrokerProcess:
    """One ``souq broker`` child process serving HTTP on a loopback port."""

    def __init__(
        self,
        *,
        nats_url: str,
        log_path: Path,
        port: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.nats_url = nats_url
        self.port = port or free_port()
        self.log_path = log_path
        self.extra_args = list(extra_args)  # e.g. ["--sample-above", "64"]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        args = [
            sys.executable,
            "-m",
            "souq",
            "broker",
            "--nats",
            self.nats_url,
            "--listen",
            f"127.0.0.1:{self.port}",
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as err:
            self.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
            )

        def healthy() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    "broker exited at start: " + self.log_path.read_text(errors="replace")[-2000:]
                )
            try:
                return httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout=timeout, interval=0.02, message="the broker to answer")

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.process
        if proc is None:
            return
        terminate(proc, timeout=timeout)
        self.process = None


class Cluster:
    """nats-server + agents + brokers, all real, all on loopback, under ``root``."""

    def __init__(
        self,
        root: Path,
        *,
        regions: Mapping[str, int] | None = None,
        cpus: float = 4,
        memory_mb: int = 4096,
        brokers: int = 1,
    ) -> None:
        self.root = root
        self.regions = dict(regions or {"mad": 2})
        self.nats = NatsServer(store_dir=root / "nats")
        self.agents: list[AgentProcess] = []
        self.brokers: list[BrokerProcess] = []
        self._cpus = cpus
        self._memory_mb = memory_mb
        self._broker_count = brokers

    @property
    def api_url(self) -> str:
        return self.brokers[0].url

    def client(self, broker: int = 0, timeout: float = 30.0) -> SouqClient:
        return SouqClient(self.brokers[broker].url, timeout=timeout)

    def add_agent(self, region: str, **kwargs: object) -> AgentProcess:
        n = sum(1 for a in self.agents if a.region == region) + 1
        agent = AgentProcess(
            region=region,
            nats_url=self.nats.url,
            data_dir=self.root / "workers" / f"{region}-{n}",
            cpus=kwargs.pop("cpus", self._cpus),  # type: ignore[arg-type]
            memory_mb=kwargs.pop("memory_mb", self._memory_mb),  # type: ignore[arg-type]
            **kwargs,  # type: ignore[arg-type]
        )
        agent.start()
        self.agents.append(agent)
        return agent

    def start(self) -> Cluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.nats.start()
        for region, count in self.regions.items():
            for _ in range(count):
                self.add_agent(region)
        for i in range(self._broker_count):
            broker = BrokerProcess(nats_url=self.nats.url, log_path=self.root / f"broker-{i}.log")
            broker.start()
            self.brokers.append(broker)
        self.wait_for_workers()
        return self

    def wait_for_workers(self, timeout: float = 30.0) -> None:
        """Until every broker lists every running agent as up."""
        want = {a.worker_id for a in self.agents if a.process is not None}
        for broker in self.brokers:
            client = SouqClient(broker.url)

            def seen(client: SouqClient = client) -> bool:
                up = {w.id for w in client.workers() if w.state.value != "down"}
                return want <= up

            wait_until(seen, timeout=timeout, message="every worker to be listed as up")

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()
        for agent in self.agents:
            agent.stop()
        self.nats.stop()

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables for the duration of a block."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
