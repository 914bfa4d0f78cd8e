"""The agent as a child subreaper: orphans of machines are re-parented to it, and it reaps them.

A machine may leave a grandchild behind (a double fork, a daemon whose parent exited). With
``PR_SET_CHILD_SUBREAPER`` such orphans become the agent's children instead of init's, so they
stay in the agent's process tree; when they exit, :class:`Reaper` reaps them (a sweep on the
event loop every :data:`SWEEP_S`: no thread). It only reaps children nobody else will: the
driver's own children (its waiters or machine processes) are reaped by the driver, which needs
their status.

**Why a sweep and not a ``SIGCHLD`` handler.** uvloop's libuv owns ``SIGCHLD`` for the
commands ``exec`` runs: it installs its handler when it spawns one and puts back the default
(no handler at all) when its last one has ended. A handler of ours was gone after the first
``exec``, and one installed while an ``exec`` ran would have taken libuv's away, whose waits
would then never return. A sweep of ``/proc/self/task/*/children`` a second costs about
0.25 ms of CPU with twenty threads.

The agent's other children are its own code's too, and that code waits for them: the ``ip``,
``iptables-restore`` and ``nft`` that threads run, and the commands ``exec`` runs (the event
loop's subprocesses). A child reaped by the reaper is lost to its waiter: ``subprocess`` takes
the lost status for 0, and the event loop's wait for it never returns (an ``exec`` that ran its
command and still timed out).

The threads' commands are in the agent's own process group, where no machine's process is
(each machine has a session of its own): those are never reaped here. ``exec``'s commands have
sessions of their own, like an orphan's: the agent names them as its own while it waits for
them. Any other exited child is left :data:`GRACE_S` to whoever waits for it (they reap within
milliseconds of its exit), and reaped only if it is still there after that: an orphan, which
nobody else waits for, is a zombie for two seconds at most.

Only ``souq agent`` (one agent per process) turns this on: it is a property of the process.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["GRACE_S", "SWEEP_S", "Reaper", "make_subreaper"]

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 1.0  # what an exited child is left to its own waiter before the reaper takes it
SWEEP_S = 1.0  # how often the children are looked at: an orphan is a zombie for 2 s at most


def make_subreaper() -> bool:
    """Make this process a child subreaper (Linux 3.4+). False when the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _children() -> set[int]:
    """This process's direct children (from /proc, every thread's list)."""
    pids: set[int] = set()
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return pids
    for task in tasks:
        try:
            pids.update(int(p) for p in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return pids


class Reaper:
    """Reaps exited children that are not ``owned()`` (orphans re-parented to the agent)."""

    def __init__(
        self, owned: Callable[[], set[int]], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._owned = owned
        self._clock = clock
        self._exited: dict[int, float] = {}  # exited children not yet reaped: first seen at
        self._loop: asyncio.AbstractEventLoop | None = None
        self._again: asyncio.TimerHandle | None = None
        self._sweep: asyncio.TimerHandle | None = None
        self.reaped = 0

    def reap(self) -> list[int]:
        """Reap every child that nobody else will: exited, not the driver's, and still there
        :data:`GRACE_S` after it was first seen exited. Returns their pids; a check again is
        set for those not yet due (when installed)."""
        now = self._clock()
        done, waiting = [], {}
        for pid in _children() - self._owned():
            if not _exited(pid) or _ours(pid):
                continue
            first = self._exited.get(pid, now)
            if now - first < GRACE_S:  # its own waiter's, if it has one
                waiting[pid] = first
                continue
            try:
                got, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if got:
                done.append(got)
        self._exited = waiting
        self.reaped += len(done)
        if done:
            log.debug("reaped orphans %s", done)
        if waiting and self._loop is not None and self._again is None:
            due = min(waiting.values()) + GRACE_S - now
            self._again = self._loop.call_later(max(due, 0.0) + 0.01, self._check_again)
        return done

    def _check_again(self) -> None:
        self._again = None
        self.reap()

    def install(self) -> None:
        """Sweep now and every :data:`SWEEP_S` on the running loop (a reap runs between two
        of the loop's callbacks, so it never interrupts the driver between two steps)."""
        self._loop = asyncio.get_running_loop()
        self._swept()

    def _swept(self) -> None:
        self.reap()
        if self._loop is not None:
            self._sweep = self._loop.call_later(SWEEP_S, self._swept)

    def uninstall(self) -> None:
        for timer in (self._again, self._sweep):
            if timer is not None:
                timer.cancel()
        self._again = self._sweep = None
        self._loop = None


def _ours(pid: int) -> bool:
    """``pid`` is in this process's own process group: the agent's code made it (a thread's
    ``ip`` or ``iptables-restore``) and waits for it; a machine's processes, and so its
    orphans, are in sessions of their own."""
    try:
        return os.getpgid(pid) == os.getpgid(0)
    except ProcessLookupError:
        return False


def _exited(pid: int) -> bool:
    """``pid``, a child of this process, has exited and is not reaped yet (left as it is)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped meanwhile, or not a child
        return False
