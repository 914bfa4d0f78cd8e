"""Test helpers, shipped with Souq so that users can test against a real cluster too.

:class:`Cluster` starts a real nats-server, real ``souq agent`` processes and real ``souq broker``
processes on loopback ports; :func:`wait_until` waits on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

import httpx
import psutil

from souq.auth.bus import NatsCredential, add_agent, credential, init_bus, worker_id_for
from souq.auth.files import AuthDir
from souq.auth.locate import find_token
from souq.client.api import SouqClient
from souq.dev import start_agent_process
from souq.lifespan import Lifespan
from souq.natscluster import NatsCluster
from souq.natsserver import NatsServer, free_port
from souq.procs import terminate
from souq.testing_host import kill_left_machines

__all__ = [
    "AgentProcess",
    "BrokerProcess",
    "Cluster",
    "FleetProcess",
    "auth_headers",
    "wait_until",
]

T = TypeVar("T")


# The longest pause between two calls of a waited-for predicate: a predicate that makes an HTTP
# client (tens of ms of CPU for its TLS context alone) polled every 10 ms for a minute would
# keep a core busy; the pauses double from ``interval`` to this instead.
MAX_INTERVAL_S = 0.1


def _pauses(interval: float) -> Iterator[float]:
    """``interval``, then twice as long each time, up to MAX_INTERVAL_S (or ``interval``)."""
    cap = max(interval, MAX_INTERVAL_S)
    pause = interval
    while True:
        yield pause
        pause = min(pause * 2, cap)


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float = 10.0,
    interval: float = 0.01,
    message: str = "condition",
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that; raise
    ``TimeoutError`` naming ``message`` once ``timeout`` seconds have passed. The pause between
    calls starts at ``interval`` and doubles up to :data:`MAX_INTERVAL_S` (or ``interval``,
    if longer)."""
    deadline = time.monotonic() + timeout
    pauses = _pauses(interval)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {message}")
        time.sleep(next(pauses))


async def eventually(
    predicate: Callable[[], Awaitable[T] | T],
    *,
    timeout: float = 10.0,
    interval: float = 0.01,
    message: str = "condition",
) -> T:
    """:func:`wait_until` for a test on an event loop: ``predicate`` (plain or a coroutine
    function) is called until it returns something truthy, which is returned, with the loop
    free between calls; ``TimeoutError`` naming ``message`` once ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    pauses = _pauses(interval)
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {message}")
        await asyncio.sleep(next(pauses))


@dataclass(kw_only=True, eq=False)
class _ChildProcess:
    """What the child processes below share: the NATS server they join, the process, and its
    stderr in ``log_path``."""

    what: ClassVar[str]  # its `souq` command, and how errors name it: "agent", "broker"...
    nats_url: str
    log_path: Path
    netns: str | None = None  # a network namespace to run in (a host of its own)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def pid(self) -> int:
        assert self.process is not None, f"the {self.what} is not running"
        return self.process.pid

    def _log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_tail(self, chars: int = 2000) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def _command(self) -> list[str]:
        """``souq <what> --nats <url>``, run by this Python."""
        return [sys.executable, "-m", "souq", self.what, "--nats", self.nats_url]

    def _prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns] if self.netns else []

    def _spawn(self, args: list[str]) -> None:
        with open(self.log_path, "ab") as err:
            self.process = subprocess.Popen(
                [*self._prefix(), *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def _log_since(self, offset: int) -> str:
        return self.log_path.read_text(errors="replace")[offset:]

    def _check_started(self) -> None:
        """:class:`RuntimeError`, with the log's tail, if the process has exited already."""
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.what} exited at start: {self.log_tail()}")

    def _terminate(self, sig: int = signal.SIGTERM, *, timeout: float) -> int | None:
        proc = self.process
        if proc is None:
            return None
        terminate(proc, sig=sig, timeout=timeout)
        self.process = None
        return proc.returncode


@dataclass(kw_only=True, eq=False)
class _WorkerProcess(_ChildProcess):
    """A child process of workers: in ``region``, each offering ``cpus`` and ``memory_mb``
    (None: the worker's own default)."""

    region: str
    cpus: float | None = None
    memory_mb: int | None = None


STARTED_WORKERS: set[str] = set()  # every worker an AgentProcess of this process started


@dataclass(kw_only=True, eq=False)
class AgentProcess(_WorkerProcess):
    """One ``souq agent`` child process. Its machines run as the test's own user by default
    (``machine_user``: the test's interpreter and files are that user's, e.g. under a home
    directory others cannot enter); ``machine_user=None`` gives the agent's own default
    (a uid of each machine's own, for an agent run as root). ``auth_dir``: its
    ``--auth-dir``. ``default_driver``: ``exec`` unless a test asks for the worker's own
    default (None: isolated where the host can)."""

    what = "agent"
    data_dir: Path
    machine_user: str | None = field(default_factory=lambda: str(os.geteuid()))
    auth_dir: Path | None = None
    labels: Mapping[str, str] | None = None
    stop_machines_on_exit: bool = True
    heartbeat_interval_s: float | None = None
    image_cache_mb: int | None = None
    # Tests of other things than isolation run plain processes unless they ask (the worker's
    # own default, None, isolates where the host can).
    default_driver: str | None = "exec"
    extra_args: Sequence[str] = ()  # e.g. ["--gpus", "4", "--gpu-model", "T4"]
    log_path: Path = field(init=False)
    worker_id: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.labels = dict(self.labels or {})
        self.log_path = self.data_dir.with_name(self.data_dir.name + ".log")

    def start(self, timeout: float = 30.0) -> None:
        offset = self._log_size()
        auth = AuthDir.from_env(None)  # a secured cluster's: the agent gets its credential
        self.process = start_agent_process(
            worker_id=add_agent(auth, worker_id_for(self.data_dir)) if auth else None,
            region=self.region,
            nats_url=self.nats_url,
            data_dir=self.data_dir,
            cpus=self.cpus,
            memory_mb=self.memory_mb,
            labels=dict(self.labels or {}),
            stop_machines_on_exit=self.stop_machines_on_exit,
            log_path=self.log_path,
            heartbeat_interval_s=self.heartbeat_interval_s,
            image_cache_mb=self.image_cache_mb,
            machine_user=self.machine_user,
            auth_dir=self.auth_dir,
            extra_args=[
                *(["--default-driver", self.default_driver] if self.default_driver else []),
                *self.extra_args,
            ],
            prefix=self._prefix(),
        )

        def ready() -> str | None:
            self._check_started()
            for line in self._log_since(offset).splitlines():
                words = line.split()
                if len(words) >= 4 and words[:2] == ["souq", "agent"] and words[3] == "ready":
                    return words[2]
            return None

        try:
            worker_id = wait_until(ready, timeout=timeout, message="the agent to be ready")
        except BaseException:
            self.stop()  # an agent that never got ready is not left running behind the test
            raise
        assert worker_id is not None
        STARTED_WORKERS.add(worker_id)
        self.worker_id = worker_id

    def machine_pids(self) -> list[int]:
        """Pids of the agent's machines' processes and their souq-waiters: the agent's
        descendants, and every process whose environment names this worker (a waiter is
        nobody's child once it is running, so as to outlive its agent)."""
        pids: set[int] = set()
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(psutil.Error):
                pids.update(p.pid for p in psutil.Process(self.process.pid).children(True))
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if self.worker_id and proc.environ().get("SOUQ_WORKER_ID") == self.worker_id:
                    pids.add(proc.pid)
                    parent = proc.parent()
                    if parent is not None and parent.name().startswith("souq-waiter"):
                        pids.add(parent.pid)
        return sorted(pids)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        return self._terminate(sig, timeout=timeout)

    def kill(self) -> None:
        """Kill -9: a crash."""
        self.stop(signal.SIGKILL)


@dataclass(kw_only=True, eq=False)
class FleetProcess(_WorkerProcess):
    """One ``souq fleet`` child process: ``workers`` hollow workers in ``region``."""

    what = "fleet"
    workers: int
    extra_args: Sequence[str] = ()  # e.g. ["--jobs", "1"]

    def start(self, timeout: float = 120.0) -> None:
        args = [*self._command(), "--workers", str(self.workers), "--region", self.region]
        args += list(self.extra_args)
        if self.cpus is not None:
            args += ["--cpus", str(self.cpus)]
        if self.memory_mb is not None:
            args += ["--memory-mb", str(self.memory_mb)]
        offset = self._log_size()
        self._spawn(args)

        def ready() -> bool:
            self._check_started()
            return "souq fleet ready:" in self._log_since(offset)

        wait_until(ready, timeout=timeout, interval=0.05, message="the fleet to be ready")

    def stop(self, timeout: float = 60.0) -> None:
        self._terminate(timeout=timeout)


@dataclass(kw_only=True, eq=False)
class _ServingProcess(_ChildProcess):
    """A child process that serves HTTP on a loopback ``port`` (default: a free one), with
    ``extra_args`` at the end of its command line."""

    port: int | None = None
    extra_args: Sequence[str] = ()
    host: str = "127.0.0.1"  # where it listens (its namespace's address, in one)

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        self.extra_args = list(self.extra_args)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _wait_answering(self, url: str, timeout: float) -> None:
        """Until ``url`` answers 200 (:class:`RuntimeError` if the process exits first)."""

        # One client for every try (each new one costs its TLS context: tens of ms of CPU).
        with httpx.Client(timeout=1.0, headers=auth_headers()) as http:

            def answering() -> bool:
                self._check_started()
                try:
                    return http.get(url).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(
                answering, timeout=timeout, interval=0.02, message=f"the {self.what} to answer"
            )

    def stop(self, timeout: float = 10.0) -> None:
        self._terminate(timeout=timeout)


@dataclass(kw_only=True, eq=False)
class BrokerProcess(_ServingProcess):
    """One ``souq broker`` child process serving HTTP on a loopback port; ``extra_args`` e.g.
    ``["--sample-above", "64"]``."""

    what = "broker"

    def start(self, timeout: float = 30.0) -> None:
        self._spawn([*self._command(), "--listen", f"{self.host}:{self.port}", *self.extra_args])
        self._wait_answering(self.url + "/healthz", timeout)


@dataclass(kw_only=True, eq=False)
class ProxyProcess(_ServingProcess):
    """One ``souq proxy`` child process on loopback ports (HTTP, and its admin port);
    ``extra_args`` e.g. ``["--autostop-interval", "1"]``."""

    what = "proxy"
    region: str = "mad"
    admin_port: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.admin_port = self.admin_port or free_port()

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, timeout: float = 30.0) -> None:
        args = [*self._command(), "--region", self.region, "--listen", f"{self.host}:{self.port}"]
        self._spawn([*args, "--admin-port", str(self.admin_port), *self.extra_args])
        if self.netns is None:
            self._wait_answering(self.admin_url + "/decisions", timeout)
            return

        # In a namespace of its own its admin port is that namespace's loopback: until its
        # HTTP port answers (an unknown app: 404).
        def serving() -> bool:
            self._check_started()
            try:
                return httpx.get(self.url + "/", timeout=1.0).status_code == 404
            except httpx.HTTPError:
                return False

        wait_until(serving, timeout=timeout, interval=0.02, message="the proxy to answer")

    def __enter__(self) -> ProxyProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def auth_headers() -> dict[str, str]:
    """The ``Authorization`` header of the token a client would send now (none: no header)."""
    token = find_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


class Cluster(Lifespan):
    """nats-server + agents + brokers, all real, all on loopback, under ``root``.

    Secured as a cluster made with ``souq cluster init`` is (``auth=False``: open): an auth
    directory under ``root/auth``, and while the cluster runs ``SOUQ_AUTH_DIR`` and
    ``SOUQ_TOKEN`` (its admin token) are set in this process's environment, so that every
    daemon a test starts joins it and every client (and :func:`auth_headers`) sends the
    token."""

    def __init__(
        self,
        root: Path,
        *,
        regions: Mapping[str, int] | None = None,
        cpus: float = 4,
        memory_mb: int = 4096,
        brokers: int = 1,
        auth: bool = True,
        nats_nodes: int = 1,
    ) -> None:
        self.root = root
        self.auth: AuthDir | None = None
        self._secured = auth
        self._environment: contextlib.ExitStack | None = None
        self.regions = dict(regions) if regions is not None else {"mad": 2}  # {}: no agents
        # More than one node: a NATS cluster, every daemon given all their URLs.
        self.nats: NatsServer | NatsCluster = (
            NatsCluster(root / "nats", nats_nodes)
            if nats_nodes > 1
            else NatsServer(store_dir=root / "nats")
        )
        self.agents: list[AgentProcess] = []
        self.brokers: list[BrokerProcess] = []
        self._cpus = cpus
        self._memory_mb = memory_mb
        self._broker_count = brokers
        # The machines' names at a port of this cluster's own (--names-port): another cluster
        # of this host (a test beside this one) answers at its own.
        self.names_port = free_port()

    @property
    def api_url(self) -> str:
        return self.brokers[0].url

    def client(
        self, broker: int = 0, timeout: float = 30.0, token: str | None = None
    ) -> SouqClient:
        """A client of one broker, with the admin token (or ``token``)."""
        if token is None and self.auth is not None:
            token = self.auth.admin()
        return SouqClient(self.brokers[broker].url, token=token, timeout=timeout)

    def nats_credential(self, role: str = "broker") -> NatsCredential | None:
        """A role's credential on this cluster's bus (None when it is open), for a test that
        connects to NATS itself: ``connect(url, credential=...)``, or nats-py's
        ``connect(url, **credential.options())``."""
        return credential(self.auth, role) if self.auth is not None else None

    def nats_options(self, role: str = "broker") -> dict[str, Any]:
        """nats-py's ``connect`` options for a role on this cluster's bus (none: it is open)."""
        cred = self.nats_credential(role)
        return cred.options() if cred is not None else {}

    def add_agent(self, region: str, **kwargs: object) -> AgentProcess:
        n = sum(1 for a in self.agents if a.region == region) + 1
        extra = [str(arg) for arg in kwargs.pop("extra_args", ())]  # type: ignore[attr-defined]
        if "--names-port" not in extra:
            extra += ["--names-port", str(self.names_port)]
        agent = AgentProcess(
            region=region,
            nats_url=self.nats.url,
            data_dir=self.root / "workers" / f"{region}-{n}",
            cpus=kwargs.pop("cpus", self._cpus),  # type: ignore[arg-type]
            memory_mb=kwargs.pop("memory_mb", self._memory_mb),  # type: ignore[arg-type]
            extra_args=extra,
            **kwargs,  # type: ignore[arg-type]
        )
        agent.start()
        self.agents.append(agent)
        return agent

    def start(self) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._secured:
            self.auth = AuthDir.create(self.root / "auth")
            init_bus(self.auth)  # NATS is locked down: each role with its own nkey
            self.nats.config = self.auth.nats_conf
            self._environment = contextlib.ExitStack()
            self._environment.enter_context(
                environment(SOUQ_AUTH_DIR=str(self.auth.path), SOUQ_TOKEN=self.auth.admin())
            )
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
            client = SouqClient(broker.url, token=self.auth.admin() if self.auth else None)

            def seen(client: SouqClient = client) -> bool:
                up = {w.id for w in client.workers() if w.state.value != "down"}
                return want <= up

            wait_until(seen, timeout=timeout, message="every worker to be listed as up")

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()
        for agent in self.agents:
            agent.stop()
        for agent in self.agents:  # what an agent left running (killed, or told to)
            kill_left_machines(agent.data_dir)
        self.nats.stop()
        if self._environment is not None:
            self._environment.close()
            self._environment = None


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
