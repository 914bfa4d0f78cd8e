"""What a job printed, kept where the queue is: JetStream's object store ``souq-job-logs``, one
object per run (``<name>/<attempt>``), so that a run's output outlives the worker that ran it.

The worker that ran it writes the object when the run ends (:mod:`souq.agent.jobs.runner`): the last
:data:`OUTPUT_MAX_BYTES` of stdout and stderr together, the head cut off and said so on the
first line. A broker reads the last run's for ``GET /sched/logs/{name}``. Objects go after
:data:`OUTPUT_TTL_S` (a week, the longest deadline a job may have). A broker makes the bucket
(:meth:`JobOutputs.open`); an agent only binds to it (:meth:`JobOutputs.bind`).
"""

from __future__ import annotations

import contextlib

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.object_store import ObjectStore

from souq.bus.jetstream import object_store, unavailable
from souq.errors import NotFound
from souq.model.job import Job

__all__ = ["LOGS", "OUTPUT_MAX_BYTES", "OUTPUT_TTL_S", "JobOutputs", "kept", "object_name"]

LOGS = "souq-job-logs"
OUTPUT_MAX_BYTES = 1024 * 1024  # kept of one run: the tail
OUTPUT_TTL_S = 7 * 86400.0
_WHAT = "the job output store"


def object_name(name: str, attempt: int) -> str:
    return f"{name}/{attempt}"


def kept(tail: bytes, dropped: int) -> bytes:
    """What is kept of a run whose output was ``dropped`` bytes and then ``tail``: at most
    :data:`OUTPUT_MAX_BYTES`, the end, after a line saying how much of the head is missing."""
    if dropped == 0 and len(tail) <= OUTPUT_MAX_BYTES:
        return tail
    room = OUTPUT_MAX_BYTES - 100  # the note's line
    cut = max(0, len(tail) - room)
    note = f"[souq: the first {dropped + cut} bytes of this run's output were not kept]\n"
    return note.encode() + tail[cut:]


class JobOutputs:
    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    @classmethod
    async def open(cls, nc: Client) -> JobOutputs:
        """The bucket, made on first use (a broker's)."""
        try:
            store = await object_store(
                nc.jetstream(),
                LOGS,
                ObjectStoreConfig(
                    description="souq batch jobs' output, one object per run",
                    storage=StorageType.FILE,
                    ttl=OUTPUT_TTL_S,
                ),
            )
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        return cls(store)

    @classmethod
    async def bind(cls, nc: Client) -> JobOutputs:
        """The bucket a broker made (an agent's; :class:`~souq.errors.Unavailable` until
        then)."""
        try:
            return cls(await nc.jetstream().object_store(LOGS))
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc

    async def put(self, name: str, attempt: int, data: bytes) -> bool:
        """Keep a run's output (at most :data:`OUTPUT_MAX_BYTES`); False when that run's was
        kept already (a second write after an answer that was lost changes nothing)."""
        key = object_name(name, attempt)
        try:
            with contextlib.suppress(nats.js.errors.ObjectNotFoundError):
                await self._store.get_info(key)
                return False
            await self._store.put(key, data[-OUTPUT_MAX_BYTES:])
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        return True

    async def get(self, name: str, attempt: int) -> bytes | None:
        """One run's output; None when it was not kept (yet)."""
        try:
            result = await self._store.get(object_name(name, attempt))
        except nats.js.errors.ObjectNotFoundError:
            return None
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        return result.data or b""

    async def last(self, job: Job) -> tuple[int, bytes]:
        """The output of the job's last run that has one kept, with its attempt number:
        the run under way has none until it ends, so it is the run before (a retry's
        first try, say). :class:`~souq.errors.NotFound` (404 ``not_found``; a job that does
        not exist is ``job_not_found``) when no run has any yet."""
        for attempt in range(job.attempts, 0, -1):
            data = await self.get(job.name, attempt)
            if data is not None:
                return attempt, data
        what = "has not run yet" if job.attempts == 0 else "has no output kept yet"
        raise NotFound(
            f"job {job.name} {what} (it is {job.state})",
            hint="a run's output is kept when the run ends; "
            "`GET /sched/status/{name}` shows where the job is",
            details={"state": str(job.state), "attempts": job.attempts},
        )
