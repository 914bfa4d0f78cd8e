"""The hollow fleet's heap: what survives a young garbage collection is frozen.

A fleet process keeps thousands of workers and every machine they made (rows, configs,
placement records: about 70 objects the collector tracks per claim), and that heap only grows.
CPython's collector scans an object in each generation it passes through, so under load the
fleet spent about a sixth of its CPU re-scanning records that can never be garbage, in pauses of
15 ms (a young collection) to 250 ms (a middle one) with 1,000 workers; more with more workers.

The records are acyclic (a claim leaves no reference cycle behind: see the fleet's tests), so
the fleet freezes (:func:`gc.freeze`) what exists once it has started, and again after every
collection: an object is scanned by at most the first young collection it survives. A cycle that
becomes garbage before that collection is still collected; one that outlives it stays in memory
(none is made by the claim path, and the fleet is a measuring tool, not a long-lived host).

Only :func:`souq.fleet.main.run` (the ``souq fleet`` process) installs it: a fleet embedded in
another process (tests, benchmarks) leaves that process's collector alone.
"""

from __future__ import annotations

import gc
from typing import Any

__all__ = ["SurvivorFreezer"]


class SurvivorFreezer:
    def __init__(self) -> None:
        self.installed = False

    def install(self) -> None:
        """Freeze the heap now, and after every collection from now on."""
        if not self.installed:
            gc.freeze()
            gc.callbacks.append(self._collected)
            self.installed = True

    def uninstall(self) -> None:
        if self.installed:
            gc.callbacks.remove(self._collected)
            self.installed = False

    @staticmethod
    def _collected(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":  # the survivors are in the older generations now: freeze them
            gc.freeze()
