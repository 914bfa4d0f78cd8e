"""``souq dev``: the whole cluster on one machine.

One process runs the embedded nats-server (a child process; ``nats_cluster`` of them, routed
into one NATS cluster, with every daemon given all their URLs), the broker (in this process) and
the workers (one ``souq agent`` child process each, with ``--stop-machines-on-exit``). Workers are
separate processes on purpose: each keeps its own SQLite file and supervises its own machines
exactly as on a real host, and a crash of one does not take the others down.

One ``souq dev`` at a time runs on a data directory: it holds a lock on the directory (an
``flock`` on ``souq-dev.lock``, for the life of the process and of its worker agents) before it
touches anything there, so a second start refuses, naming the directory and the pid holding it,
and leaves the running cluster alone. The directory is kept across runs, workers and NATS store
included: a restart finds the cluster as it was left.

On SIGINT or SIGTERM everything started here stops, in order: the broker, then the agents (which
stop their machines with each machine's stop config), then nats-server. This process makes itself
a child subreaper, so a machine process orphaned by a crashed agent is re-parented here and is
killed too: nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import itertools
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
import psutil
from pydantic import BaseModel, ConfigDict, Field, field_validator

from souq.auth.bus import add_agent, agent_dir, init_bus, worker_id_for
from souq.auth.files import AuthDir
from souq.auth.locate import default_dev_dir
from souq.daemon import loop_factory
from souq.dev_network import HostNetwork, host_network
from souq.errors import Conflict, SouqError, Unavailable
from souq.natscluster import NatsCluster
from souq.natsserver import NatsServer, free_port
from souq.network.addresses import PROXY_ADDRESS
from souq.portledger import next_block
from souq.procs import terminate

__all__ = [
    "LOCK_FILE",
    "DevCluster",
    "DevConfig",
    "lock_data_dir",
    "port_block",
    "run",
    "start_agent_process",
    "worker_share",
]

_PR_SET_CHILD_SUBREAPER = 36


class DevConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    port: int = Field(default=4280, ge=0, le=65535, description="broker HTTP port (0: any free)")
    proxy_port: int = Field(
        default=4281, ge=0, le=65535, description="the edge proxy's port (0: any free)"
    )
    domain: str = Field(default="localhost", description="APP.<domain> reaches app APP")
    autostop_interval_s: float = Field(default=60.0, gt=0, description="the proxy's autostop")
    nats_port: int | None = Field(default=None, ge=0, le=65535, description="default: any free")
    nats_cluster: int = Field(
        default=1, ge=1, le=7, description="NATS nodes (more than one: a NATS cluster)"
    )
    regions: tuple[str, ...] = ("mad", "syd")
    workers_per_region: int = Field(default=2, ge=1, le=64)
    worker_cpus: float | None = Field(
        default=None, gt=0, description="default: the host's cores shared out, at least 1 each"
    )
    worker_memory_mb: int | None = Field(
        default=None, gt=0, description="default: the host's memory shared out among the workers"
    )
    image_cache_mb: int | None = Field(default=None, ge=0, description="each worker's image cache")
    machine_user: str | None = Field(
        default=None, description="who machines run as (default: nobody for root, else you)"
    )
    data_dir: Path | None = Field(
        default=None,
        description="default: /var/lib/souq/dev as root, else ~/.local/state/souq/dev; kept "
        "across runs (its keys, admin token, workers and NATS store); one souq dev at a time "
        "(a lock on the directory)",
    )
    host: str = "127.0.0.1"
    ready_timeout_s: float = 60.0
    log_format: Literal["text", "json"] = Field(
        default="text", description="json: agents log one JSON object per line too"
    )

    @field_validator("regions")
    @classmethod
    def _regions(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("at least one region is needed")
        for region in v:
            if not region or not region.replace("-", "").isalnum():
                raise ValueError(f"region {region!r} must be letters, digits and '-'")
        return v


@dataclass(frozen=True)
class DevCluster:
    """What ``souq dev`` started, reported once it is ready."""

    api_url: str
    nats_url: str
    data_dir: Path
    workers: tuple[tuple[str, str], ...]  # (region, data dir name)
    proxy_url: str = ""  # http://HOST:PORT; a request for APP.<domain> reaches app APP
    domain: str = "localhost"


def set_child_subreaper() -> bool:
    """Become the reaper of orphaned descendants (Linux); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


PORT_BLOCKS = (20000, 32000, 250)  # agents started from here: 250 ports each, below 32768
_port_blocks = itertools.count()


def port_block() -> tuple[int, int]:
    """The next block of host ports for an agent started from this process, or from any
    process sharing a port ledger (:mod:`souq.portledger`) with it. The blocks come round again
    after 48 agents; the agent skips a port something else listens on."""
    first, end, size = PORT_BLOCKS
    count = (end - first) // size
    turn = next_block(count)
    low = first + (next(_port_blocks) if turn is None else turn) % count * size
    return low, low + size - 1


def start_agent_process(
    *,
    region: str,
    nats_url: str,
    data_dir: Path,
    cpus: float | None = None,
    memory_mb: int | None = None,
    labels: dict[str, str] | None = None,
    stop_machines_on_exit: bool = True,
    log_path: Path | None = None,
    heartbeat_interval_s: float | None = None,
    log_format: str = "text",
    ports: tuple[int, int] | None = None,
    image_cache_mb: int | None = None,
    machine_user: str | None = None,
    auth_dir: Path | None = None,
    worker_id: str | None = None,
    extra_args: Sequence[str] = (),
    prefix: Sequence[str] = (),
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """``souq agent`` as a child process; its stderr goes to ``log_path`` (default: beside its
    data dir). ``ports``: its machines' host ports (default: the next block of
    :func:`port_block`, so that agents of one host never hand out the same port).
    ``extra_args`` end its command line (e.g. ``["--gpus", "4", "--gpu-model", "T4"]``);
    ``prefix`` comes before it (e.g. ``ip netns exec NAME``: an agent on a host of its own);
    ``pass_fds`` stay open in it (``souq dev``'s lock on its data directory)."""
    args = [
        *prefix,
        sys.executable,
        "-m",
        "souq",
        "agent",
        "--region",
        region,
        "--nats",
        nats_url,
        "--data-dir",
        str(data_dir),
    ]
    if cpus is not None:
        args += ["--cpus", f"{cpus:g}"]
    if memory_mb is not None:
        args += ["--memory-mb", str(memory_mb)]
    if image_cache_mb is not None:
        args += ["--image-cache-mb", str(image_cache_mb)]
    if machine_user is not None:  # root only as asked for: the caller named it
        args += ["--machine-user", machine_user]
        if machine_user in ("0", "root"):
            args.append("--allow-root-machines")
    for key, value in (labels or {}).items():
        args += ["--label", f"{key}={value}"]
    if stop_machines_on_exit:
        args.append("--stop-machines-on-exit")
    if heartbeat_interval_s is not None:
        args += ["--heartbeat-interval", f"{heartbeat_interval_s:g}"]
    if log_format != "text":
        args += ["--log-format", log_format]
    if auth_dir is not None:
        args += ["--auth-dir", str(auth_dir)]
    if worker_id is not None:
        args += ["--worker-id", worker_id]
    low, high = ports or port_block()
    args += ["--ports", f"{low}-{high}", *extra_args]
    data_dir.mkdir(parents=True, exist_ok=True)
    log = log_path or data_dir.with_name(data_dir.name + ".log")
    # The agent's log is its own: machines (other uids on this host) may not read it.
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    with open(fd, "ab") as err:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            pass_fds=tuple(pass_fds),
        )


def _reap_orphans() -> None:
    """Collect exit statuses of re-parented orphans so none lingers as a zombie."""
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return


def _kill_descendants(keep: set[int]) -> None:
    """SIGKILL every descendant of this process not in ``keep`` and reap it."""
    me = psutil.Process()
    victims = [p for p in me.children(recursive=True) if p.pid not in keep]
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(victims, timeout=5)
    _reap_orphans()


async def _wait_ready(
    api_url: str,
    workers: int,
    agents: list[subprocess.Popen[bytes]],
    deadline: float,
    token: str,
) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api_url, timeout=2.0, headers=headers) as client:
        while True:
            for agent in agents:
                if agent.poll() is not None:
                    raise Unavailable(
                        f"a worker agent exited at start with status {agent.returncode}",
                        hint="see its log in the dev data directory",
                    )
            with contextlib.suppress(httpx.HTTPError):
                resp = await client.get("/v1/workers")
                if resp.status_code == 200 and len(resp.json()) >= workers:
                    return
            if time.monotonic() > deadline:
                raise Unavailable("the dev cluster did not become ready in time")
            await asyncio.sleep(0.05)


async def _serve(config: DevConfig, report: Callable[[DevCluster], None]) -> None:

    data_dir = config.data_dir or default_dev_dir()
    # Before anything in the directory is touched: a second `souq dev` on it refuses here.
    lock = lock_data_dir(data_dir)
    # Machines' users pass through to their workers' directories; they list nothing here.
    for passable in (data_dir, data_dir / "workers", data_dir / "agent-auth"):
        passable.mkdir(parents=True, exist_ok=True)
        passable.chmod(0o711)
    try:
        await _serve_locked(config, data_dir, report, lock)
    finally:
        os.close(lock)


async def _serve_locked(
    config: DevConfig, data_dir: Path, report: Callable[[DevCluster], None], lock: int
) -> None:
    """The cluster in ``data_dir``, kept as it was left (its workers' machines, its NATS
    store): a restart loses nothing."""
    from souq.broker.config import BrokerConfig
    from souq.broker.main import serve as serve_broker

    auth = AuthDir.create(data_dir, private=False)
    init_bus(auth)  # the embedded NATS is locked down as a cluster's is
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    nats = _nats(config, data_dir, auth)
    agents: list[subprocess.Popen[bytes]] = []
    broker_task: asyncio.Task[None] | None = None
    broker_stop = asyncio.Event()
    proxy_task: asyncio.Task[None] | None = None
    host = HostNetwork()  # none until NATS is up
    try:
        nats.start()
        host = await host_network(nats.url, auth)
        names = _start_agents(
            config, nats.url, data_dir, agents, lock, agent_args=host.agent_args()
        )
        port = config.port or free_port(config.host)
        broker = BrokerConfig(
            nats_url=nats.url, listen_host=config.host, listen_port=port, auth_dir=auth.path
        )
        broker_task = asyncio.create_task(serve_broker(broker, stop=broker_stop))
        api_url = f"http://{config.host}:{port}"
        proxy_port = config.proxy_port or free_port(config.host)
        proxy_ready = asyncio.Event()
        proxy_task = _start_proxy(
            config,
            nats.url,
            proxy_port,
            proxy_ready,
            broker_stop,
            auth_dir=auth.path,
            flycast=(PROXY_ADDRESS, host.flycast_port) if host.flycast_port else None,
        )
        ready = asyncio.create_task(
            _wait_ready(
                api_url,
                len(agents),
                agents,
                time.monotonic() + config.ready_timeout_s,
                auth.admin(),
            )
        )
        stopped = asyncio.create_task(stop.wait())
        daemons = {broker_task, proxy_task}
        done, _ = await asyncio.wait(
            {ready, stopped, *daemons}, return_when=asyncio.FIRST_COMPLETED
        )
        if ready in done:
            ready.result()
            await asyncio.wait(
                {asyncio.create_task(proxy_ready.wait()), proxy_task},
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not proxy_task.done():
                proxy_url = f"http://{config.host}:{proxy_port}"
                report(
                    DevCluster(api_url, nats.url, data_dir, tuple(names), proxy_url, config.domain)
                )
                await asyncio.wait({stopped, *daemons}, return_when=asyncio.FIRST_COMPLETED)
        else:
            ready.cancel()
        for task in daemons:
            if task.done() and not task.cancelled():
                task.result()  # surface why a daemon stopped (e.g. port in use)
        stopped.cancel()
    finally:
        broker_stop.set()
        await _daemons_ended(broker_task, proxy_task)
        await asyncio.to_thread(_stop_agents, agents)
        await host.aclose()  # the names, once no agent is left to ask
        nats.stop()


async def _daemons_ended(*tasks: asyncio.Task[None] | None) -> None:
    """The broker's and the proxy's tasks, told to stop, each given 10 s to end (why one
    failed was surfaced already)."""
    for task in tasks:
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(10):
                    await task


LOCK_FILE = "souq-dev.lock"
AGENT_AUTH = "agent-auth"  # DATA_DIR/agent-auth/NAME: what one agent is given of the auth dir


def lock_data_dir(data_dir: Path) -> int:
    """Take ``data_dir`` for this process: an exclusive ``flock`` on its ``souq-dev.lock`` (the
    holder's pid written in it), held until the descriptor returned is closed or the process
    ends, however it ends (and by the worker agents it starts, which inherit it).
    :class:`~souq.errors.Conflict` naming the directory and the pid that holds it when another
    ``souq dev`` runs there; nothing else in the directory is touched."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        gone = holder.isdigit() and not psutil.pid_exists(int(holder))
        raise Conflict(
            f"souq dev is already running on {data_dir} (pid {holder}"
            + (", which has exited: a worker agent it started still holds the lock" if gone else "")
            + "): a second one there would take its workers and NATS from under it",
            hint=(
                f"stop the souq agent processes whose --data-dir is under {data_dir}"
                if gone
                else f"stop it first (kill {holder}), or give this one another --data-dir"
            ),
            details={"data_dir": str(data_dir), "pid": holder},
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _start_agents(
    config: DevConfig,
    nats_url: str,
    data_dir: Path,
    agents: list[subprocess.Popen[bytes]],
    lock: int,
    *,
    agent_args: Sequence[str] = (),
) -> list[tuple[str, str]]:
    """Start the workers (into ``agents`` as they start); their (region, name)s. Each inherits
    the directory's ``lock``: while an agent of this cluster lives (this process killed with
    -9, say), no other ``souq dev`` starts agents on its workers' files. Each has the private
    network where the host can (the agent's default), with ``agent_args``
    (:class:`souq.dev_network.HostNetwork`)."""
    from souq.agent.fingerprint import host_cpus, host_memory_mb

    names = _worker_names(config)
    cpus, memory_mb = worker_share(host_cpus(), host_memory_mb(), len(names))
    for region, name in names:
        agents.append(
            start_agent_process(
                region=region,
                nats_url=nats_url,
                data_dir=data_dir / "workers" / name,
                cpus=config.worker_cpus if config.worker_cpus is not None else cpus,
                memory_mb=(
                    config.worker_memory_mb if config.worker_memory_mb is not None else memory_mb
                ),
                log_format=config.log_format,
                image_cache_mb=config.image_cache_mb,
                auth_dir=_agent_auth(data_dir, name),
                worker_id=_credential_for(data_dir, name),
                machine_user=config.machine_user,
                pass_fds=(lock,),
                extra_args=list(agent_args),
            )
        )
    return names


def worker_share(host_cpus: float, host_memory_mb: int, workers: int) -> tuple[float, int]:
    """What each of ``workers`` workers on one host offers unless told: its share of the
    host's memory (never more than the host has, all workers together), and its share of the
    CPUs, at least one core (a machine's default size: on a host with fewer cores than workers,
    the cores are shared, as CPU time can be, and a default machine still fits)."""
    workers = max(workers, 1)
    cpus = max(1.0, math.floor(host_cpus / workers * 100) / 100)
    return cpus, max(1, host_memory_mb // workers)


def _worker_names(config: DevConfig) -> list[tuple[str, str]]:
    """The workers ``souq dev`` runs: (region, name) of each."""
    return [
        (region, f"{region}-{i}")
        for region in config.regions
        for i in range(1, config.workers_per_region + 1)
    ]


def _nats(config: DevConfig, data_dir: Path, auth: AuthDir) -> NatsServer | NatsCluster:
    """The embedded NATS: one server, or a cluster of ``nats_cluster`` nodes (the first on
    ``nats_port``), each knowing every worker's credential from the start."""
    for _region, name in _worker_names(config):
        _credential_for(data_dir, name)
    if config.nats_cluster == 1:
        return NatsServer(
            port=config.nats_port or None, store_dir=data_dir / "nats", config=auth.nats_conf
        )
    ports = [config.nats_port or 0] + [0] * (config.nats_cluster - 1)
    return NatsCluster(
        data_dir / "nats", config.nats_cluster, config=auth.nats_conf, host=config.host, ports=ports
    )


def _credential_for(data_dir: Path, name: str) -> str:
    """The worker id of the agent ``name``: its credential, added to the bus if new."""
    return add_agent(AuthDir(data_dir), worker_id_for(data_dir / "workers" / name))


def _agent_auth(data_dir: Path, name: str) -> Path:
    """The auth directory the agent ``name`` is given: its own seed and the secrets key only
    (``DATA_DIR/agent-auth/NAME``), not the cluster's whole directory: no token key, admin
    token, nor another daemon's seed (so no ``view`` seed either: the machines' names are
    answered by this process, :func:`souq.dev_network.start_names`)."""
    auth = AuthDir(data_dir)
    return agent_dir(auth, _credential_for(data_dir, name), data_dir / AGENT_AUTH / name).path


def _start_proxy(
    config: DevConfig,
    nats_url: str,
    port: int,
    ready: asyncio.Event,
    stop: asyncio.Event,
    *,
    auth_dir: Path,
    flycast: tuple[str, int] | None = None,
) -> asyncio.Task[None]:
    """The edge proxy, in this process: its region is the cluster's first."""
    from souq.proxy.daemon import ProxyConfig
    from souq.proxy.main import serve as serve_proxy

    proxy = ProxyConfig(
        nats_url=nats_url,
        region=config.regions[0],
        listen=(config.host, port),
        domain=config.domain,
        autostop_interval_s=config.autostop_interval_s,
        auth_dir=auth_dir,
        flycast=flycast,
    )
    return asyncio.create_task(serve_proxy(proxy, ready=ready, stop=stop), name="souq-proxy")


def _stop_agents(agents: list[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    keep = {os.getpid()}
    if nats_pids := [p.pid for p in psutil.Process().children() if p.name() == "nats-server"]:
        keep.update(nats_pids)
    terminate(*agents, timeout=timeout)
    _kill_descendants(keep)


def souq_command() -> str:
    """How the user runs this ``souq`` from the shell that started it: ``souq`` when that is
    the one on ``PATH``, else its path (relative to the working directory when it lies below
    it, as ``.venv/bin/souq`` does after ``make dev``), else ``python -m souq``."""
    argv0 = Path(sys.argv[0])
    script = argv0 if argv0.name == "souq" else Path(sys.executable).with_name("souq")
    if not (script.is_file() and os.access(script, os.X_OK)):
        return f"{sys.executable} -m souq"
    script = script.absolute()
    on_path = shutil.which("souq")
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return "souq"
    with contextlib.suppress(ValueError):
        return str(script.relative_to(Path.cwd().absolute()))
    return str(script)


def _print_ready(cluster: DevCluster) -> None:
    souq = souq_command()
    lines = [
        "Souq dev cluster is ready",
        f"  API:  {cluster.api_url}",
        f"  proxy: {cluster.proxy_url} (a request for APP.{cluster.domain} reaches app APP)",
        f"  NATS: {cluster.nats_url}",
        f"  data: {cluster.data_dir}",
        f"  token: {cluster.data_dir / 'admin.token'} (admin; "
        + (
            f"{souq} finds it)"
            if cluster.data_dir == default_dev_dir()
            else f"for the CLI: export SOUQ_TOKEN=$(cat {cluster.data_dir / 'admin.token'}))"
        ),
        "  workers: " + ", ".join(name for _, name in cluster.workers),
        f"Try: {souq} machine run --app hello --region "
        + cluster.workers[0][0]
        + " --port 8080 -- sh -c 'exec python3 -m http.server $PORT'",
        f"     curl -H 'Host: hello.{cluster.domain}' {cluster.proxy_url}/",
        f"     dashboard: {cluster.api_url}/ui#token=TOKEN (TOKEN: the admin token's file)",
        "Press Ctrl-C to stop everything.",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def run(config: DevConfig, *, report: Callable[[DevCluster], None] | None = None) -> None:
    """Run the dev cluster in the foreground until SIGINT or SIGTERM."""
    set_child_subreaper()
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(_serve(config, report or _print_ready))
    except SouqError:
        raise
    except OSError as exc:
        raise Unavailable(f"souq dev could not start: {exc}") from exc
