"""Stopping child processes: a signal, a deadline, then SIGKILL; and whether a pid runs."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

__all__ = ["pid_alive", "terminate"]


def terminate(
    *procs: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10.0
) -> None:
    """Send ``sig`` to every process still running, wait for all of them against one deadline,
    and SIGKILL (and reap) whichever is still running when it passes."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
