"""Health checks run by the worker for its machines, reported on the machine record.

Each check of a started machine (``checks: {NAME: {type: http|tcp, port, path, interval,
timeout, grace_period}}``) runs every ``interval`` against the host port its internal port was
given, on the worker itself: ``http`` must answer ``GET path`` with a status below 400 within
``timeout`` (the answer's status line read by httptools), ``tcp`` must accept a connection. A
check's status is ``warning`` until it first passes or fails, ``passing`` or ``critical`` after
(a failure within ``grace_period`` of the start stays ``warning``), with what it saw as its
``output``. The machine record carries the statuses (``checks``), and a change wakes whoever
waits on the machine (a deploy waits for its new machines to be healthy:
:meth:`souq.agent.machines.commands.Commands.wait`). A machine that is not started has no checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import httptools

from souq.agent.state.records import MachineRow
from souq.clock import iso_from_ms
from souq.model.machine import CheckStatus, MachineState
from souq.model.services import Check

__all__ = ["MachineChecks", "probe"]

log = logging.getLogger(__name__)

MAX_ANSWER = 64 * 1024  # what a check reads of an answer, at most (its status line comes first)


class _StatusLine:
    """httptools' callbacks: the answer's status code, once its headers are in."""

    def __init__(self) -> None:
        self.done = False

    def on_headers_complete(self) -> None:
        self.done = True


async def probe(host: str, port: int, check: Check) -> str | None:
    """None if the check passes, else what it saw."""
    try:
        async with asyncio.timeout(check.timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                if check.type == "tcp":
                    return None
                return await _http_get(reader, writer, host, port, check.path)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except TimeoutError:
        return f"no answer within {check.timeout:g}s"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"


async def _http_get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int, path: str
) -> str | None:
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: souq-check\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(request.encode())
    await writer.drain()
    status = _StatusLine()
    parser = httptools.HttpResponseParser(status)
    read = 0
    while not status.done:
        data = await reader.read(4096)
        if not data:
            return f"GET {path}: the connection closed before an answer"
        read += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            break
        except httptools.HttpParserError as exc:
            return f"GET {path}: not an HTTP answer ({exc})"
        if read > MAX_ANSWER:
            return f"GET {path}: no complete answer in {MAX_ANSWER} bytes"
    code = parser.get_status_code()
    return None if code < 400 else f"GET {path} answered {code}"


class MachineChecks:
    """The checks of every started machine of this worker, and their statuses."""

    def __init__(self, notify: Callable[[str], None], host: str = "127.0.0.1") -> None:
        self._notify = notify  # wakes the machine's waiters
        self._host = host
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._status: dict[str, dict[str, CheckStatus]] = {}

    def statuses(self, machine_id: str) -> list[CheckStatus]:
        return sorted(self._status.get(machine_id, {}).values(), key=lambda s: s.name)

    def healthy(self, machine_id: str) -> bool:
        """Every check of the machine passes (true for a machine without checks)."""
        return all(s.status == "passing" for s in self._status.get(machine_id, {}).values())

    def follow(self, row: MachineRow) -> None:
        """Run the machine's checks while it is started (from the start: a restart or an
        update starts them again with its config); stop them otherwise."""
        started = row.state is MachineState.STARTED and row.address is not None
        running = self._tasks.get(row.id)
        if running is not None and (not started or running[0].get_name() != _key(row)):
            self.forget(row.id)
            running = None
        if started and running is None and row.config.checks:
            loop = asyncio.get_running_loop()
            self._status[row.id] = {
                name: _status(name, "warning", "not run yet") for name in row.config.checks
            }
            self._tasks[row.id] = [
                loop.create_task(self._loop(row, name, check), name=_key(row))
                for name, check in row.config.checks.items()
            ]
            self._notify(row.id)

    def forget(self, machine_id: str) -> None:
        for task in self._tasks.pop(machine_id, []):
            task.cancel()
        if self._status.pop(machine_id, None):
            self._notify(machine_id)

    async def aclose(self) -> None:
        tasks = [t for ts in self._tasks.values() for t in ts]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self, row: MachineRow, name: str, check: Check) -> None:
        assert row.address is not None
        port = row.address.port_for(check.port)
        if port is None:
            self._report(row.id, name, "critical", f"port {check.port} has no host port")
            return
        grace_until = time.monotonic() + check.grace_period
        while True:
            host = row.address.host if row.address.private_ip else self._host
            problem = await probe(host, port, check)
            if problem is None:
                self._report(row.id, name, "passing", "OK")
            elif time.monotonic() < grace_until:
                self._report(row.id, name, "warning", f"{problem} (in its grace period)")
            else:
                self._report(row.id, name, "critical", problem)
            await asyncio.sleep(check.interval)

    def _report(self, machine_id: str, name: str, status: str, output: str) -> None:
        statuses = self._status.get(machine_id)
        if statuses is None:
            return
        before = statuses.get(name)
        statuses[name] = _status(name, status, output)
        if before is None or before.status != status:
            log.info("machine %s: check %s is %s: %s", machine_id, name, status, output)
            self._notify(machine_id)


def _key(row: MachineRow) -> str:
    """The checks' task name: the machine and its config's version (an update restarts them)."""
    return f"check-{row.id}-{row.instance_id}-{row.pid}"


def _status(name: str, status: str, output: str) -> CheckStatus:
    return CheckStatus(
        name=name, status=status, output=output, updated_at=iso_from_ms(int(time.time() * 1000))
    )
