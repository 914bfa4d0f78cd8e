"""The three supervisors of the supervision benchmark (``bench/supervise.py``), behind one small
interface, each configured for the same job: ``n`` programs, each ``sleep MARKER`` with its name
in ``SOUQ_MACHINE_ID``, restarted after every exit, its output kept in a file of its own.

* :class:`SouqAgent`: one ``souq agent`` process on a nats-server; programs are machines made
  by one ``claim_batch`` request per 100 (the verb a broker's batch create sends), with restart
  policy ``always``.
* :class:`Supervisord`: ``supervisord -n`` with ``n`` ``[program:x]`` sections
  (``autorestart=true``, ``startsecs=0``), driven over its XML-RPC interface.
* :class:`Circusd`: ``circusd`` with ``n`` watchers of one process each, driven over its ZeroMQ
  control socket.

``launch(n, autostart=...)`` starts the daemon, and with ``autostart`` its programs (circus
always: its start-all starts only watchers marked autostart; Souq never: machines are made by
request); ``start_all()`` is the one request that starts every program and returns when the
daemon answers it; ``stop_all()`` stops (Souq: destroys) them all; ``close()`` stops the daemon
and anything it left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
import uuid
import xmlrpc.client
from pathlib import Path
from typing import Any

import psutil

from bench.procevents import KEY_VAR
from souq.agent.config import AgentConfig
from souq.bus import subjects
from souq.bus.codec import encode, unwrap_as, unwrap_list_as
from souq.bus.nats import NatsTransport, connect
from souq.model import Machine
from souq.model.batch import BatchClaimReply, BatchClaimRequest
from souq.model.machine import MachineConfig, MachineEvent
from souq.model.protocol import DestroyCommand, EventsCommand
from souq.natsserver import free_port
from souq.procs import terminate
from souq.testing import wait_until

__all__ = ["Circusd", "Daemon", "SouqAgent", "Supervisord", "rss_mb"]

SLEEP = shutil.which("sleep") or "/bin/sleep"
BIN = Path(sys.executable).parent
REGION = "bench"
BATCH = 100  # machines per claim_batch request (a reply must stay under NATS's 1 MiB)
CGROUP_RETRIES_S = 1.5  # the agent retries removing a busy cgroup for about 1.3 s

# ``souq agent`` has no flag for the restart backoff, so the benchmark starts the same agent
# through its config: the same modules (the CLI's, imported first) and the same ``run``.
_AGENT = (
    "import json, sys\n"
    "import souq.client.cli\n"
    "from souq.agent.config import AgentConfig\n"
    "from souq.agent.main import run\n"
    "run(AgentConfig.model_validate(json.loads(sys.argv[1])))\n"
)


def rss_mb(pid: int) -> float:
    return round(float(psutil.Process(pid).memory_info().rss) / 2**20, 1)


def _program(i: int) -> str:
    return f"p{i:04d}"


def _binary(name: str) -> str:
    path = BIN / name
    if not path.exists():
        raise SystemExit(f"{name} is not installed: pip install -e '.[bench]' (or make bench)")
    return str(path)


class Daemon:
    """One supervisor process and what it runs; see the module docstring."""

    name = ""

    def __init__(self, root: Path, marker: str) -> None:
        self.root = root
        self.marker = marker
        self.n = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._descendants: set[int] = set()

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} is not running"
        return self.proc.pid

    def launch(self, n: int, *, autostart: bool = False) -> None:
        raise NotImplementedError

    def start_all(self) -> None:
        raise NotImplementedError

    def stop_all(self) -> None:
        raise NotImplementedError

    def memory(self) -> dict[str, Any]:
        """The daemon's own resident memory, and USS (pages no other process shares)."""
        info = psutil.Process(self.pid).memory_full_info()
        return {"rss_mb": round(info.rss / 2**20, 1), "uss_mb": round(info.uss / 2**20, 1)}

    def _spawn(self, args: list[str], log: Path) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True
            )

    def _check_running(self, log: Path) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {log.read_text(errors='replace')[-2000:]}")

    def remember_descendants(self) -> None:
        """Note the daemon's descendants, to kill whatever of them outlives it."""
        if self.proc is not None:
            with contextlib.suppress(psutil.Error):
                kids = psutil.Process(self.proc.pid).children(recursive=True)
                self._descendants |= {p.pid for p in kids}

    def close(self) -> None:
        self.remember_descendants()
        if self.proc is not None:
            terminate(self.proc, timeout=60)
            self.proc = None
        for pid in self._descendants:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).send_signal(signal.SIGKILL)
        self._descendants.clear()


class SouqAgent(Daemon):
    name = "souq"

    def __init__(
        self,
        root: Path,
        marker: str,
        nats_url: str,
        *,
        backoff_s: float = 0.0,
        options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(root, marker)
        self.nats_url = nats_url
        self.backoff_s = backoff_s  # the first restart's delay (the agent's default: 0.1 s)
        self.options = dict(options or {})  # more AgentConfig fields
        self.ids: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._bus: NatsTransport | None = None
        self.worker_id = ""

    def launch(self, n: int, *, autostart: bool = False) -> None:
        assert not autostart, "a Souq agent starts machines on request only"
        self.n = n
        config = AgentConfig(
            region=REGION,
            nats_url=self.nats_url,
            data_dir=self.root / "agent",
            cpus=1000,
            memory_mb=1_000_000,
            stop_machines_on_exit=True,
            restart_backoff_base_s=self.backoff_s,  # 0: restart at once, every time
            **self.options,
        )
        log = self.root / "agent.log"
        self._spawn([sys.executable, "-c", _AGENT, config.model_dump_json()], log)

        def ready() -> str | None:
            self._check_running(log)
            for line in log.read_text(errors="replace").splitlines():
                words = line.split()
                if words[:2] == ["souq", "agent"] and len(words) > 3 and words[3] == "ready":
                    return words[2]
            return None

        self.worker_id = str(wait_until(ready, timeout=60, interval=0.02, message="the agent"))
        self._bus = self._run(connect(self.nats_url, name="souq-bench-supervise"))

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    def _config(self) -> MachineConfig:
        body = {
            "cmd": [SLEEP, self.marker],
            "guest": {"cpus": 0.01, "memory_mb": 16},
            "restart": {"policy": "always"},
        }
        return MachineConfig.model_validate_json(json.dumps(body))  # as a broker receives it

    async def _claim(self, count: int) -> list[Machine]:
        assert self._bus is not None
        req = BatchClaimRequest(
            request_id=uuid.uuid4().hex,
            body_hash="bench",
            app="bench",
            region=REGION,
            config=self._config(),
            request_ids=[uuid.uuid4().hex for _ in range(count)],
        )
        subject = subjects.worker(self.worker_id, "claim_batch")
        reply = await self._bus.request(subject, encode(req), timeout=120)
        return unwrap_as(reply, BatchClaimReply).machines

    def start_all(self) -> None:
        async def claims() -> list[list[Machine]]:
            sizes = [min(BATCH, self.n - i) for i in range(0, self.n, BATCH)]
            return await asyncio.gather(*(self._claim(k) for k in sizes))

        machines = [m for batch in self._run(claims()) for m in batch]
        bad = [m.state.value for m in machines if m.state.value != "started"]
        assert not bad, f"machines not started: {bad[:5]}"
        self.ids = [m.id for m in machines]

    def stop_all(self) -> None:
        async def destroy_all() -> None:
            assert self._bus is not None
            bus = self._bus
            limit = asyncio.Semaphore(32)
            subject = subjects.worker(self.worker_id, "destroy")

            async def destroy(machine_id: str) -> None:
                cmd = DestroyCommand(app="bench", machine_id=machine_id, force=True)
                async with limit:
                    unwrap_as(await bus.request(subject, encode(cmd), timeout=60), Machine)

            await asyncio.gather(*(destroy(m) for m in self.ids))

        self._run(destroy_all())
        self.ids = []

    def events(self, machine_id: str) -> list[MachineEvent]:
        """The machine's events as the agent recorded them, newest first."""
        assert self._bus is not None
        cmd = EventsCommand(app="bench", machine_id=machine_id)
        subject = subjects.worker(self.worker_id, "events")
        reply = self._run(self._bus.request(subject, encode(cmd), timeout=30))
        return unwrap_list_as(reply, MachineEvent)

    def waiters(self) -> list[psutil.Process]:
        """The agent's ``souq-waiter`` children: one per running machine, plus a few idle."""
        kids = psutil.Process(self.pid).children()
        return [p for p in kids if p.name().startswith("souq-waiter")]

    def memory(self) -> dict[str, Any]:
        out = super().memory()
        rss = pss = 0
        waiters = self.waiters()
        for proc in waiters:
            with contextlib.suppress(psutil.Error):
                info = proc.memory_full_info()
                rss += info.rss
                pss += info.pss
        out["waiters"] = {
            "count": len(waiters),
            "rss_total_mb": round(rss / 2**20, 1),
            "pss_total_mb": round(pss / 2**20, 1),
        }
        return out

    def close(self) -> None:
        try:
            if self.ids and self.proc is not None and self.proc.poll() is None:
                self.stop_all()  # destroyed machines leave no cgroups behind...
                time.sleep(CGROUP_RETRIES_S)  # ...once the agent's retries for busy ones ran
        finally:
            if self._bus is not None:
                with contextlib.suppress(Exception):
                    self._run(self._bus.close())
                self._bus = None
            super().close()
            self._loop.close()


class Supervisord(Daemon):
    name = "supervisord"

    def launch(self, n: int, *, autostart: bool = False) -> None:
        self.n = n
        port = free_port()
        self.root.mkdir(parents=True, exist_ok=True)
        lines = [
            "[supervisord]",
            f"logfile={self.root / 'supervisord.log'}",
            f"pidfile={self.root / 'supervisord.pid'}",
            f"childlogdir={self.root}",
            "loglevel=warn",
            "minfds=16384",
            "user=root",
            "[inet_http_server]",
            f"port=127.0.0.1:{port}",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        ]
        for i in range(n):
            name = _program(i)
            lines += [
                f"[program:{name}]",
                f"command={SLEEP} {self.marker}",
                f"autostart={'true' if autostart else 'false'}",
                "autorestart=true",
                "startsecs=0",
                "stopsignal=TERM",
                "redirect_stderr=true",
                f"stdout_logfile={self.root / name}.log",
                f'environment={KEY_VAR}="{name}"',
            ]
        conf = self.root / "supervisord.conf"
        conf.write_text("\n".join(lines) + "\n")
        log = self.root / "daemon.log"
        self._spawn([_binary("supervisord"), "-n", "-c", str(conf)], log)
        self.url = f"http://127.0.0.1:{port}/RPC2"
        self.rpc: Any = xmlrpc.client.ServerProxy(self.url)

        def ready() -> bool:
            self._check_running(log)
            try:
                return bool(self.rpc.supervisor.getState()["statename"] == "RUNNING")
            except OSError:
                return False

        wait_until(ready, timeout=60, interval=0.02, message="supervisord")

    def start_all(self) -> None:
        self.rpc.supervisor.startAllProcesses(True)

    def stop_all(self) -> None:
        self.rpc.supervisor.stopAllProcesses(True)


class Circusd(Daemon):
    def __init__(self, root: Path, marker: str, *, check_delay: float | None = None) -> None:
        super().__init__(root, marker)
        self.check_delay = check_delay  # None: circus's default (5 s from an ini file)
        self.name = "circus" if check_delay is None else f"circus (check_delay {check_delay:g})"
        self.client: Any = None

    def launch(self, n: int, *, autostart: bool = False) -> None:
        from circus.client import CircusClient  # only with the bench extra

        self.n = n
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        lines = [
            "[circus]",
            f"endpoint = {endpoint}",
            f"pubsub_endpoint = tcp://127.0.0.1:{free_port()}",
            "statsd = False",
            "loglevel = WARNING",
            f"logoutput = {self.root / 'circusd.log'}",
        ]
        if self.check_delay is not None:
            lines.append(f"check_delay = {self.check_delay:g}")
        for i in range(n):
            name = _program(i)
            out = self.root / f"{name}.log"
            lines += [
                f"[watcher:{name}]",
                f"cmd = {SLEEP}",
                f"args = {self.marker}",
                "numprocesses = 1",
                "autostart = True",  # circus's start-all starts only autostart watchers
                "stdout_stream.class = FileStream",
                f"stdout_stream.filename = {out}",
                "stderr_stream.class = FileStream",
                f"stderr_stream.filename = {out}",
                f"[env:{name}]",
                f"{KEY_VAR} = {name}",
            ]
        self.root.mkdir(parents=True, exist_ok=True)
        ini = self.root / "circus.ini"
        ini.write_text("\n".join(lines) + "\n")
        log = self.root / "daemon.log"
        self._spawn([_binary("circusd"), str(ini)], log)
        self.client = CircusClient(endpoint=endpoint, timeout=300)

        def ready() -> bool:
            self._check_running(log)
            return self._call("list", timeout=1) is not None

        wait_until(ready, timeout=60, interval=0.05, message="circusd")

    def _call(self, command: str, timeout: float | None = None, **props: Any) -> Any:
        from circus.exc import CallError

        client = self.client
        if timeout is not None:
            client.timeout = timeout * 1000
        try:
            return client.call({"command": command, "properties": props})
        except CallError:
            return None
        finally:
            client.timeout = client._timeout * 1000

    def _command(self, command: str) -> None:
        """``command`` for every watcher, waiting until it is done; retried while the arbiter
        still runs an earlier one (its own start-up start, for one)."""
        deadline = time.monotonic() + 120
        while True:
            answer = self._call(command, waiting=True)
            if answer and answer.get("status") == "ok":
                return
            busy = answer and "already running" in str(answer.get("reason"))
            if not busy or time.monotonic() > deadline:
                raise RuntimeError(f"circus {command}: {answer}")
            time.sleep(0.01)

    def start_all(self) -> None:
        self._command("start")

    def stop_all(self) -> None:
        self._command("stop")

    def close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.stop()
            self.client = None
        super().close()
