"""Does a machine fit? The one rule shared by offers (advisory) and claims (binding)."""

from __future__ import annotations

from dataclasses import dataclass

from souq.model.resources import Resources

__all__ = ["Shortfall", "shortfall"]


@dataclass(frozen=True)
class Shortfall:
    reason: str  # a stable code: insufficient_cpu or insufficient_memory
    detail: str  # human words


def shortfall(want: Resources, capacity: Resources, allocated: Resources) -> Shortfall | None:
    """None when ``want`` fits in what ``capacity`` leaves after ``allocated``; else why not."""
    free = capacity.minus(allocated)
    if want.millicpus > free.millicpus:
        return Shortfall(
            "insufficient_cpu",
            f"needs {want.cpus:g} cpus; {max(free.cpus, 0):g} of {capacity.cpus:g} free",
        )
    if want.memory_mb > free.memory_mb:
        left = max(free.memory_mb, 0)
        return Shortfall(
            "insufficient_memory",
            f"needs {want.memory_mb} MiB; {left} of {capacity.memory_mb} MiB free",
        )
    return None
