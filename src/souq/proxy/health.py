"""Health checks: a machine whose check fails leaves rotation, and comes back when it passes.

Each check of a started machine (``checks: {NAME: {type: http|tcp, port, path, interval,
timeout, grace_period}}``, Fly's fields) runs every ``interval`` against the host port its
internal port was given: ``http`` must answer ``GET path`` with a status below 400 within
``timeout``, ``tcp`` must accept a connection. The first failure takes the machine out of
rotation (so within one interval of it going bad), the first pass after puts it back; failures
within ``grace_period`` of a start do not count. A machine that is not started has no checks
running. Changes are recorded with the check's name and what it saw.

:meth:`HealthChecks.ready_since` says since when a started machine has proven itself: once every
check of it has passed since it started (at its start, for one without checks). Autostop never
counts a machine as idle before then: a deploy waits on exactly that (:mod:`souq.proxy.idle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import httpx

from souq.daemon import cancel_tasks
from souq.model import Check, Machine
from souq.proxy.decisions import Decisions
from souq.proxy.table import RoutingTable

__all__ = ["HealthChecks", "run_check"]

log = logging.getLogger(__name__)


async def run_check(client: httpx.AsyncClient, host: str, port: int, check: Check) -> str | None:
    """None if the check passes, else what it saw."""
    try:
        if check.type == "tcp":
            async with asyncio.timeout(check.timeout):
                _, writer = await asyncio.open_connection(host, port)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return None
        r = await client.get(f"http://{host}:{port}{check.path}", timeout=check.timeout)
    except (OSError, TimeoutError, httpx.HTTPError) as exc:
        return f"{type(exc).__name__}: {exc}".rstrip(": ")
    if r.status_code >= 400:
        return f"GET {check.path} answered {r.status_code}"
    return None


class HealthChecks:
    def __init__(self, table: RoutingTable, decisions: Decisions) -> None:
        self._table = table
        self._decisions = decisions
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._failing: dict[str, set[str]] = {}  # machine id -> names of failing checks
        self._unproven: dict[str, set[str]] = {}  # started: names of checks not passed yet
        self._ready: dict[str, float] = {}  # started: when its last check first passed
        self._client = httpx.AsyncClient(headers={"User-Agent": "souq-proxy-check"})

    def follow(self, machine: Machine) -> None:
        """Run the machine's checks while it is started; stop them otherwise."""
        started = machine.state.value == "started" and machine.address is not None
        running = machine.id in self._tasks
        if started and machine.id not in self._ready and machine.id not in self._unproven:
            if machine.config.checks:
                self._unproven[machine.id] = set(machine.config.checks)
            else:
                self._ready[machine.id] = time.monotonic()
        elif not started:
            self._unproven.pop(machine.id, None)
            self._ready.pop(machine.id, None)
        if started and not running and machine.config.checks:
            loop = asyncio.get_running_loop()
            self._tasks[machine.id] = [
                loop.create_task(self._loop(machine, name, check), name=f"check-{machine.id}")
                for name, check in machine.config.checks.items()
            ]
        elif not started and running:
            self.forget(machine.id)

    def forget(self, machine_id: str) -> None:
        for task in self._tasks.pop(machine_id, []):
            task.cancel()
        self._failing.pop(machine_id, None)
        self._unproven.pop(machine_id, None)
        self._ready.pop(machine_id, None)

    def ready_since(self, machine_id: str) -> float | None:
        """When (``time.monotonic()``) the started machine's checks had all passed since its
        start (its start, without checks); None while one has not, or it is not started."""
        return self._ready.get(machine_id)

    async def aclose(self) -> None:
        tasks = [t for ts in self._tasks.values() for t in ts]
        self._tasks.clear()
        await cancel_tasks(tasks)
        await self._client.aclose()

    async def _loop(self, machine: Machine, name: str, check: Check) -> None:
        assert machine.address is not None
        port = machine.address.port_for(check.port)
        if port is None:
            log.warning(
                "check %s of machine %s: port %d has no host port", name, machine.id, check.port
            )
            return
        loop = asyncio.get_running_loop()
        grace_until = loop.time() + check.grace_period
        while True:
            problem = await run_check(self._client, machine.address.host, port, check)
            if problem is None or loop.time() >= grace_until:
                self._report(machine, name, problem)
            await asyncio.sleep(check.interval)

    def _report(self, machine: Machine, name: str, problem: str | None) -> None:
        unproven = self._unproven.get(machine.id)
        if problem is None and unproven is not None:
            unproven.discard(name)
            if not unproven:
                del self._unproven[machine.id]
                self._ready[machine.id] = time.monotonic()
        failing = self._failing.setdefault(machine.id, set())
        was_healthy = not failing
        if problem is None:
            failing.discard(name)
        else:
            failing.add(name)
        healthy = not failing
        if healthy == was_healthy:
            return
        self._table.set_healthy(machine.id, healthy)
        if healthy:
            self._decisions.record("healthy", machine.app, machine.id, f"check {name} passes")
        else:
            self._decisions.record(
                "unhealthy", machine.app, machine.id, f"check {name} failed: {problem}"
            )
