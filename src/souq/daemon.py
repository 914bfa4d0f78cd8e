"""How Souq's daemons (``souq agent``, ``souq broker``, ``souq fleet``) run their event loop:
uvloop when it is installed, and the garbage collector tuned for a long-lived process
(:mod:`souq.gc_tuning`); and how their parts end the tasks they own."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from souq import gc_tuning

__all__ = ["cancel_tasks", "loop_factory", "run", "run_until_signalled"]


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


def run_until_signalled(serve: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> None:
    """Run ``serve(stop)`` (blocking) where ``stop`` is set by SIGINT or SIGTERM: how a daemon
    runs in the foreground."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await serve(stop)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    run(main())
