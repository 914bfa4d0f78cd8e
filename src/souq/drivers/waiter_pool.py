"""souq-waiters started ahead of need: a few kept ready, blocked reading their job, so that a
machine's spawn waits for no waiter's start-up (see :mod:`souq.drivers.exec` and waiter.c)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from souq.drivers import processes
from souq.drivers.base import SpawnError
from souq.drivers.cgroups import Cgroups

__all__ = ["IdleWaiter", "WaiterPool"]

log = logging.getLogger(__name__)

_POOL_SIZE = 2  # souq-waiters kept ready


@dataclass(frozen=True, slots=True)
class IdleWaiter:
    """A souq-waiter started ahead of need, blocked reading its job on its stdin."""

    pid: int
    job: int  # the write end of its stdin
    report: int  # the read end of its report pipe
    start_time: float
    spare: str | None = None  # the spare cgroup it sits in (see souq.drivers.cgroups)
    warm: int | None = None  # a warm waiter's: the write end its machine's job comes through


class WaiterPool:
    """The ready waiters of one driver (none when it runs without souq-waiter)."""

    def __init__(self, waiter: Path | None, nofile: int | None, spares: Cgroups | None) -> None:
        self._waiter = waiter
        self._nofile = nofile
        self._spares = spares
        self._pool: list[IdleWaiter] = []  # waiters ready for a job
        self.pids: set[int] = set()  # theirs: the driver reaps them, not the agent's reaper
        self._refill: asyncio.Task[None] | None = None
        self._starter: concurrent.futures.ThreadPoolExecutor | None = None  # starts waiters
        self._starting: concurrent.futures.Future[IdleWaiter] | None = None

    def new_warm(self) -> IdleWaiter:
        """A waiter for a sandbox made ahead of its machine (:mod:`souq.drivers.warm`), in a
        spare cgroup: its ``job`` is its first job's pipe, and its ``warm`` the machine's."""
        assert self._waiter is not None
        return self._new(self._waiter, spare=True, warm=True)

    def _new(self, waiter: Path, spare: bool = False, *, warm: bool = False) -> IdleWaiter:
        """Start a waiter, which blocks reading its job; with ``spare``, in a spare cgroup.
        ``os.posix_spawn`` (a vfork: about half the CPU of ``Popen``, and no Popen object to
        keep per machine) returns once the waiter is exec'd, about 0.7 ms here, and a move into
        a cgroup can take several: so a few are kept ready, started from a thread of our own
        (see :meth:`_fill`)."""
        job_r, job_w = os.pipe()
        report_r, report_w = os.pipe()
        warm_r, warm_w = os.pipe2(os.O_CLOEXEC) if warm else (-1, -1)
        argv, actions = [str(waiter), "3", str(self._nofile)], []
        if warm:
            argv.append("4")
            actions.append((os.POSIX_SPAWN_DUP2, warm_r, 4))
        try:
            pid = os.posix_spawn(
                waiter,
                argv,
                {},
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, job_r, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_DUP2, 1, 2),
                    (os.POSIX_SPAWN_DUP2, report_w, 3),
                    *actions,
                ],
                setsid=True,
            )
        except OSError as exc:
            for fd in (job_w, report_r, warm_w):
                if fd >= 0:
                    os.close(fd)
            raise SpawnError(f"cannot run souq-waiter: {exc.strerror or exc}") from exc
        finally:
            for fd in (job_r, report_w, warm_r):
                if fd >= 0:
                    os.close(fd)
        self.pids.add(pid)
        cgroup = self._spares.make_spare(pid) if spare and self._spares is not None else None
        started = processes.start_time(pid) or 0.0
        return IdleWaiter(pid, job_w, report_r, started, cgroup, warm_w if warm else None)

    def ready(self) -> list[IdleWaiter]:
        """The waiters ready now, first taken first."""
        return list(self._pool)

    def prepare(self, count: int) -> None:
        """Have ``count`` waiters ready (started now, together, if need be): a batch's spawns
        then wait for no waiter's start-up but the first."""
        if self._waiter is None:
            return
        while len(self._pool) < count:
            self._pool.append(self._new(self._waiter))

    def take(self) -> IdleWaiter:
        """The first ready waiter still alive (one killed while it waited, by a stray
        ``kill -9`` or the OOM killer, is reaped and passed over), else a new one."""
        assert self._waiter is not None
        while self._pool:
            idle = self._pool.pop(0)
            if not processes.exited(idle.pid):
                break
            log.warning(
                "a ready souq-waiter (pid %d) died while it waited; using another", idle.pid
            )
            self.discard(idle)
        else:
            idle = self._new(self._waiter)
        if self._refill is None:
            self._refill = asyncio.get_running_loop().create_task(self._fill(self._waiter))
        return idle

    async def _fill(self, waiter: Path) -> None:
        """Top the pool of ready waiters up, off the event loop (a thread of our own): a waiter
        is not a machine process (it sets no parent-death signal of its own; its child's is
        tied to the waiter, which is single-threaded), so starting it from a helper thread is
        safe, and the loop stays free to answer offers and claims meanwhile."""
        if self._starter is None:
            self._starter = concurrent.futures.ThreadPoolExecutor(1, "souq-waiters")
        try:
            while len(self._pool) < _POOL_SIZE:
                self._starting = self._starter.submit(self._new, waiter, True)
                idle = await asyncio.wrap_future(self._starting)
                self._starting = None
                self._pool.append(idle)
        except SpawnError as exc:
            log.warning("cannot keep a souq-waiter ready: %s", exc)
        finally:
            self._refill = None

    def discard(self, idle: IdleWaiter) -> None:
        """End a ready waiter (an empty job: it exits at once) and drop its spare cgroup."""
        self.pids.discard(idle.pid)
        for fd in (idle.job, idle.report, -1 if idle.warm is None else idle.warm):
            with contextlib.suppress(OSError):
                os.close(fd)  # -1: none (a warm waiter's first job is sent and closed)
        try:
            pidfd = os.pidfd_open(idle.pid)
        except OSError:
            pass
        else:
            ended = processes.pidfd_readable(pidfd, 1.0)
            os.close(pidfd)
            if ended:  # else the agent's reaper gets it, now that it is not ours
                processes.reap(idle.pid)
        if idle.spare is not None and self._spares is not None:
            self._spares.drop_spare(idle.spare)

    def close(self) -> None:
        if self._refill is not None:
            self._refill.cancel()
            self._refill = None
        if self._starting is not None:  # a waiter being started: let it finish, then end it
            with contextlib.suppress(Exception):
                self.discard(self._starting.result(timeout=5))
            self._starting = None
        if self._starter is not None:
            self._starter.shutdown(wait=False)
            self._starter = None
        for idle in self._pool:
            self.discard(idle)
        self._pool.clear()
        self.pids.clear()
