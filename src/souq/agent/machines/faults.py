"""Fault injection for crash tests: make the agent die like a ``kill -9`` right after it has
recorded a chosen op-log step, to show that every step of every operation recovers.

Off unless the agent process starts with ``SOUQ_FAULT_INJECTION=1``. Then, after each op-log
step it commits, the agent looks for ``<data dir>/fault``; if the file names that step
(``<op kind>:<op state>``, e.g. ``restart:spawning``), the agent removes the file (so the next
agent does not die too) and calls ``os._exit(137)``: no cleanup, no flush, no reply. The step's
actions have not run yet, which is the widest window a crash can hit.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["FaultPoint", "fault_point"]

EXIT_CODE = 137  # what a shell reports for SIGKILL


class FaultPoint:
    def __init__(self, path: Path) -> None:
        self.path = path

    def after_step(self, kind: str, state: str) -> None:
        """Die here if the armed fault names this step."""
        try:
            armed = self.path.read_text().strip()
        except OSError:
            return
        if armed == f"{kind}:{state}":
            with contextlib.suppress(OSError):
                self.path.unlink()
            os._exit(EXIT_CODE)


def fault_point(data_dir: Path) -> FaultPoint | None:
    """The agent's fault point, when fault injection is on."""
    if os.environ.get("SOUQ_FAULT_INJECTION") != "1":
        return None
    return FaultPoint(data_dir / "fault")
