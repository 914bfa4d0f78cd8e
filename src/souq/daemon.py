"""How Souq's daemons (``souq agent``, ``souq broker``, ``souq fleet``) run their event loop:
uvloop when it is installed, and the garbage collector tuned for a long-lived process
(:mod:`souq.gc_tuning`); and how their parts end the tasks they own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from souq import gc_tuning

__all__ = ["cancel_tasks", "loop_factory", "run"]


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop, or None (asyncio's own) where uvloop is not built."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return None
    new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return new_loop


async def cancel_tasks(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel each task, then wait for each to end (its cancellation swallowed)."""
    owned = [t for t in tasks if t is not None]
    for task in owned:
        task.cancel()
    for task in owned:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run a daemon's main coroutine to its end (blocking)."""
    gc_tuning.tune()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(main)
