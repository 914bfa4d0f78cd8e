"""Stopping child processes: a signal, a deadline, then SIGKILL; whether a pid runs; and whether
this host can run the root tools a feature needs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["pid_alive", "root_tools_missing", "terminate"]


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


def root_tools_missing(tools: Sequence[str], *, not_root: str) -> str | None:
    """Why ``tools`` cannot run here: ``not_root`` when this process is not root, else the ones
    not installed; None when they can."""
    if os.geteuid() != 0:
        return not_root
    absent = [t for t in tools if shutil.which(t) is None]
    if absent:
        return f"{', '.join(absent)} not installed (Debian: apt-get install iproute2 iptables)"
    return None
