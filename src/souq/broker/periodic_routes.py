"""The periodic jobs' routes (``/sched/periodic``, docs/jobs.md "Periodic jobs"): made by
``POST /sched/submit`` with ``cron``, listed, shown (their recent runs and why) and deleted.
The same app checks as a job's (:mod:`souq.broker.sched_routes`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import Response

from souq.auth.access import Permit, permit_of
from souq.auth.tokens import Scope
from souq.broker.bodies import json_response
from souq.errors import JobNotFound
from souq.jobs.periodic import PeriodicJobs
from souq.jobs.queue import JobQueue
from souq.model import APP_NAME_PATTERN
from souq.model.job import JOB_NAME, PERIODIC_NAME_MAX, PeriodicJob

__all__ = ["periodic_routes", "shown_periodic"]

REDACTED = "[redacted]"
Name = Annotated[
    str, Path(pattern=JOB_NAME, max_length=PERIODIC_NAME_MAX, description="the periodic job")
]
OfApp = Annotated[
    str | None, Query(pattern=APP_NAME_PATTERN, max_length=63, description="only this app's")
]


def _permit(request: Request) -> Permit:
    return permit_of(request.scope.get("state"))


Allowed = Annotated[Permit, Depends(_permit)]


def shown_periodic(record: PeriodicJob, permit: Permit) -> PeriodicJob:
    """Its template's env values only to a token that may work its queue."""
    if not record.spec.env or permit.allows(record.app, Scope.QUEUE):
        return record
    env = dict.fromkeys(record.spec.env, REDACTED)
    return record.model_copy(update={"spec": record.spec.model_copy(update={"env": env})})


async def _record(
    periodic: PeriodicJobs, name: str, permit: Permit, needs: Scope = Scope.READ
) -> PeriodicJob:
    record = await periodic.get(name)
    if not (permit.allows(record.app, Scope.READ) or permit.allows(record.app, Scope.QUEUE)):
        raise JobNotFound(f"no periodic job {name}", hint="`souq job periodic` lists them")
    permit.require(record.app, needs)
    return record


def periodic_routes(router: APIRouter, queue: JobQueue) -> None:
    @router.get("/periodic", response_model=list[PeriodicJob])
    async def periodic_list(permit: Allowed, app: OfApp = None) -> Response:
        """Every periodic job the token may read, by name: its schedule in words, its next
        time, its recent runs (each with the time it was due and why, or why it was skipped)."""
        records = [
            r
            for r in await (await queue.periodic()).all()
            if app in (None, r.app) and permit.allows(r.app, Scope.READ)
        ]
        return json_response([shown_periodic(r, permit) for r in records])

    @router.get("/periodic/{name}", response_model=PeriodicJob)
    async def periodic_show(name: Name, permit: Allowed) -> Response:
        record = await _record(await queue.periodic(), name, permit)
        return json_response(shown_periodic(record, permit))

    @router.delete("/periodic/{name}", response_model=PeriodicJob)
    async def periodic_delete(name: Name, permit: Allowed) -> Response:
        """No more runs of it are queued (the runs already queued stay)."""
        periodic = await queue.periodic()
        await _record(periodic, name, permit, Scope.WRITE)
        return json_response(shown_periodic(await periodic.delete(name), permit))
