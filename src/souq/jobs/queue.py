"""What a broker runs for batch jobs: the queue's store, opened on first use, and a sweep every
second that requeues jobs whose worker's lease ran out and fails those past their deadline.

Every broker sweeps; they never need to agree on who does, because each change is a
compare-and-set on the job's revision (:mod:`souq.jobs.store`): of two brokers expiring one
lease, one changes the job and the other finds it changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.aio.client import Client

from souq.bus.jetstream import OnFirstUse
from souq.clock import Clock
from souq.errors import SouqError
from souq.jobs.store import JobStore

__all__ = ["SWEEP_S", "JobQueue"]

log = logging.getLogger(__name__)

SWEEP_S = 1.0


class JobQueue:
    def __init__(
        self, client: Callable[[], Client], *, clock: Clock | None = None, sweep_s: float = SWEEP_S
    ) -> None:
        self._store = OnFirstUse(lambda: JobStore.open(client(), clock=clock))
        self._sweep_s = sweep_s
        self._task: asyncio.Task[None] | None = None

    async def store(self) -> JobStore:
        return await self._store.get()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sweep(), name="souq-jobs-sweep")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_s)
            try:
                for job in await (await self.store()).sweep():
                    log.info("job %s: %s", job.name, job.why)
            except SouqError as exc:  # NATS down or no JetStream: the next sweep tries again
                log.debug("job sweep: %s", exc)
