"""Scale from zero: start a stopped (or resume a suspended) machine inside the request.

When no machine of an app can take a request and one may be started (``autostart``), the relay
asks :meth:`Waker.wake`. The waker starts the nearest such machine through its worker (the
``start`` verb over NATS: a suspended machine is thawed, a stopped one spawned), then holds on
until the machine's port accepts a connection, and hands the machine to the relay. Requests
of one app that need a machine while a wake-up runs share it; a machine that cannot be
started (its worker is gone, it failed) gives way to the next one. Every wake-up is recorded
with its reason and its latency (:mod:`souq.proxy.decisions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from souq.errors import SouqError
from souq.model import Machine
from souq.model.protocol import StartCommand
from souq.protocol import WorkerClient
from souq.protocol.verbs import START
from souq.proxy.decisions import Decisions
from souq.proxy.table import WAKEABLE_STATES, Backend, RoutingTable

__all__ = ["Waker", "port_accepts"]

log = logging.getLogger(__name__)

_FIRST_POLL_S = 0.0005
_MAX_POLL_S = 0.02


async def port_accepts(host: str, port: int, deadline: float) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted before ``deadline`` (the loop's
    clock): tried again at short, growing intervals while nothing listens yet."""
    loop = asyncio.get_running_loop()
    pause = _FIRST_POLL_S
    while True:
        try:
            async with asyncio.timeout(max(0.001, deadline - loop.time())):
                _, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError):
            if loop.time() + pause >= deadline:
                return False
            await asyncio.sleep(pause)
            pause = min(_MAX_POLL_S, pause * 2)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True


@dataclass(kw_only=True)
class Waker:
    """The relay's ``wake`` hook. ``seen`` is told every record a start returns (the feed and
    the view take it at once, before the event does); ``waking`` the id of each machine about
    to be started."""

    table: RoutingTable
    workers: WorkerClient
    decisions: Decisions
    seen: Callable[[Machine], None]
    waking: Callable[[str], None] = lambda _: None  # before a machine is started
    woken: Callable[[str], None] = lambda _: None  # once that is over, whether it worked or not
    # Whether the relay keeps an idle connection to an address (the process's main sets it):
    # then a suspended machine's port was open when it was frozen.
    connected: Callable[[tuple[str, int]], bool] = lambda _: False
    region: str | None = None
    timeout_s: float = 10.0
    _running: dict[str, asyncio.Task[Backend | None]] = field(default_factory=dict)

    async def wake(self, app: str, region: str | None) -> Backend | None:
        task = self._running.get(app)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._wake(app, region or self.region))
            self._running[app] = task
            task.add_done_callback(lambda _: self._running.pop(app, None))
        return await asyncio.shield(task)

    def candidates(self, app: str, region: str | None) -> list[Backend]:
        """The app's machines that may be started for a request, best first: the nearest
        region, then suspended before stopped (a resume is faster than a spawn)."""
        found = [
            b
            for b in self.table.backends(app)
            if b.state in WAKEABLE_STATES
            and b.autostart
            and not b.cordoned
            and not self.table.is_draining(b.machine_id)
        ]
        return sorted(
            found,
            key=lambda b: (b.region != region, b.state != "suspended", b.machine_id),
        )

    async def _wake(self, app: str, region: str | None) -> Backend | None:
        loop = asyncio.get_running_loop()
        began = time.perf_counter()
        deadline = loop.time() + self.timeout_s
        for backend in self.candidates(app, region):
            was = backend.state
            self.waking(backend.machine_id)
            try:
                woken = await self._start(app, backend, deadline)
            finally:
                self.woken(backend.machine_id)
            if woken is None:
                continue
            seconds = time.perf_counter() - began
            how = "resumed" if was == "suspended" else "started"
            self.decisions.record(
                "wake",
                app,
                backend.machine_id,
                f"a request found no machine serving; {how} the {was} machine in {backend.region}",
                seconds=seconds,
            )
            return woken
        return None

    async def _start(self, app: str, backend: Backend, deadline: float) -> Backend | None:
        """Start one machine and wait for its port; None (recorded why) if that failed."""
        loop = asyncio.get_running_loop()
        try:
            machine = await self.workers.call(
                backend.worker_id,
                START,
                StartCommand(app=app, machine_id=backend.machine_id, wake=True),
                timeout=max(0.1, deadline - loop.time()),
            )
        except SouqError as exc:
            self.decisions.record(
                "wake_failed", app, backend.machine_id, f"could not start it: {exc}"
            )
            return None
        self.seen(machine)
        # A resumed machine the relay holds a connection to was listening when it was frozen,
        # and still is: no probe. (Probing it would leave one more connection in its backlog
        # each time, which a server busy on the relay's kept-alive connection does not accept:
        # after a few resumes the backlog is full and the probe times out.) One frozen before
        # it listened is probed like a spawned one.
        address = (backend.host, backend.port)
        listening = backend.state == "suspended" and self.connected(address)
        if not listening and not await port_accepts(backend.host, backend.port, deadline):
            self.decisions.record(
                "wake_failed",
                app,
                backend.machine_id,
                f"started, but port {backend.port} did not accept within the deadline",
            )
            return None
        return self.table.get(backend.machine_id)
