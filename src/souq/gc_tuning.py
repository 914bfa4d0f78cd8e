"""Garbage-collector settings for the long-running daemons (agent, broker, fleet).

CPython's default (a young collection every 700 new container objects, and a full one whenever
the survivors grow by a quarter) is tuned for short scripts. A daemon that holds a large, slowly
changing state (a broker's event ring and worker table, a fleet's thousand workers) then spends
a quarter to a third of its CPU in the collector, with full collections of up to half a second
in the middle of requests (measured: ``docs/benchmarks.md``, "Garbage collection"). Souq's own
state is acyclic (records, rows, dicts), so cycles are rare and can wait: :func:`tune` freezes
what exists after start-up (never scanned again) and raises the young threshold, which makes
collections about a hundred times rarer without holding on to much memory.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "tune"]

YOUNG_THRESHOLD = 50_000


def tune() -> None:
    """Call once a daemon has started (its modules imported, its state loaded)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
