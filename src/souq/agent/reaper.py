"""The agent as a child subreaper: orphans of machines are re-parented to it, and it reaps them.

A machine may leave a grandchild behind (a double fork, a daemon whose parent exited). With
``PR_SET_CHILD_SUBREAPER`` such orphans become the agent's children instead of init's, so they
stay in the agent's process tree; when they exit, :class:`Reaper` reaps them at once (on
``SIGCHLD``, through the event loop: no thread). It only reaps children nobody else will: the
driver's own children (its waiters or machine processes) are reaped by the driver, which needs
their status.

Only ``souq agent`` (one agent per process) turns this on: it is a property of the process.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

__all__ = ["Reaper", "make_subreaper"]

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36


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

    def __init__(self, owned: Callable[[], set[int]]) -> None:
        self._owned = owned
        self.reaped = 0
        self._previous: signal._HANDLER = signal.SIG_DFL

    def reap(self) -> list[int]:
        """Reap every exited child that nobody else will; return their pids."""
        done = []
        for pid in _children() - self._owned():
            try:
                got, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if got:
                done.append(got)
        self.reaped += len(done)
        if done:
            log.debug("reaped orphans %s", done)
        return done

    def install(self) -> None:
        """Reap soon after every SIGCHLD (the handler only schedules :meth:`reap` on the event
        loop, so a reap never interrupts the driver between two steps), and once now.

        uvloop keeps ``add_signal_handler(SIGCHLD)`` for its own subprocesses, which the agent
        does not use; the handler is therefore installed with :func:`signal.signal`.
        """
        import asyncio

        loop = asyncio.get_running_loop()

        def on_sigchld(signum: int, frame: object) -> None:
            loop.call_soon_threadsafe(self.reap)

        self._previous = signal.signal(signal.SIGCHLD, on_sigchld)
        signal.siginterrupt(signal.SIGCHLD, False)
        self.reap()

    def uninstall(self) -> None:
        signal.signal(signal.SIGCHLD, self._previous)
