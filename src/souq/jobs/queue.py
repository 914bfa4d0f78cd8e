"""What a broker runs for batch jobs: the queue's store and the runs' output store
(:mod:`souq.jobs.output`), opened on first use (the sweep's first round opens both, so that
agents find them), a sweep every second that requeues jobs whose worker's lease ran out and
fails those past their deadline, and (given a listener) the watch that tells every job's changes
(:mod:`souq.jobs.watch`).

Every broker sweeps; they never need to agree on who does, because each change is a
compare-and-set on the job's revision (:mod:`souq.jobs.store`): of two brokers expiring one
lease, one changes the job and the other finds it changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.aio.client import Client
from nats.js.kv import KeyValue

from souq.bus.jetstream import OnFirstUse, reconnects
from souq.clock import Clock
from souq.errors import SouqError
from souq.jobs.output import JobOutputs
from souq.jobs.periodic import PeriodicJobs
from souq.jobs.store import BUCKET, JobStore
from souq.jobs.watch import JobListener, JobWatch

__all__ = ["SWEEP_S", "JobQueue"]

log = logging.getLogger(__name__)

SWEEP_S = 1.0


class JobQueue:
    def __init__(
        self,
        client: Callable[[], Client],
        *,
        clock: Clock | None = None,
        sweep_s: float = SWEEP_S,
        listener: JobListener | None = None,
    ) -> None:
        self._client = client
        self._store = OnFirstUse(lambda: JobStore.open(client(), clock=clock))
        self._outputs = OnFirstUse(lambda: JobOutputs.open(client()))
        self._periodic = OnFirstUse(self._open_periodic)
        self._periodic_task: asyncio.Task[None] | None = None
        self._sweep_s = sweep_s
        self._task: asyncio.Task[None] | None = None
        self.watch = (
            None
            if listener is None
            else JobWatch(self._bucket, listener, lambda: reconnects(self._client()))
        )

    async def store(self) -> JobStore:
        return await self._store.get()

    async def _bucket(self) -> KeyValue:
        await self.store()  # made on first use
        return await self._client().jetstream().key_value(BUCKET)

    async def _open_periodic(self) -> PeriodicJobs:
        return await PeriodicJobs.open(self._client(), await self.store())

    async def periodic(self) -> PeriodicJobs:
        """The periodic jobs' templates (souq.jobs.periodic)."""
        return await self._periodic.get()

    async def _periodic_rounds(self) -> None:
        while True:
            try:
                periodic = await self.periodic()
            except SouqError as exc:  # NATS down or no JetStream: try again in a while
                log.debug("periodic jobs: %s", exc)
                await asyncio.sleep(self._sweep_s)
                continue
            await periodic.run()

    async def outputs(self) -> JobOutputs:
        return await self._outputs.get()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._sweep(), name="souq-jobs-sweep")
        self._periodic_task = loop.create_task(self._periodic_rounds(), name="souq-jobs-periodic")
        if self.watch is not None:
            self.watch.start()

    async def close(self) -> None:
        if self.watch is not None:
            await self.watch.close()
        for task in (self._task, self._periodic_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_s)
            try:
                await self.outputs()  # made for the agents, which only bind to it
                for job in await (await self.store()).sweep():
                    log.info("job %s: %s", job.name, job.why)
            except SouqError as exc:  # NATS down or no JetStream: the next sweep tries again
                log.debug("job sweep: %s", exc)
