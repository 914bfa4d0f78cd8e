"""The ``/sched`` API: batch jobs as the seed design's toy orchestrator names them, over the queue
in JetStream (:mod:`souq.jobs`). docs/jobs.md tells each route.

Users: ``POST /sched/submit``, ``GET /sched/status/{name}``, ``POST /sched/cancel/{name}``,
``GET /sched/logs/{name}`` (what its last run printed, kept by the agent that ran it).
Pulling workers: ``GET /sched/jobs`` (waiting and claimable now), ``POST /sched/claim/{name}``
(200 to exactly one claimant, 409 to the others), ``POST /sched/release/{name}`` (the run
ended: optionally ``{"exit_code": N}``), ``POST /sched/return/{name}`` (given back untouched),
``GET /sched/cancellations``. Registered workers (push): ``POST /sched/register``,
``GET /sched/assigned``, ``POST /sched/started/{name}``, ``POST /sched/stopped/{name}``. Beyond
the seed: ``POST /sched/renew/{name}`` keeps a long job's lease, ``GET /sched/list`` shows every
job.

A worker names itself with ``?worker=NAME`` (or the ``X-Souq-Worker`` header); without a name
anyone may act on a job, as in the seed. ``?lease_s=`` sets a claim's lease (default 30 s).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import PlainTextResponse, Response

from souq.broker.bodies import body_schema, json_response, parse_body
from souq.errors import NotFound
from souq.jobs.core import DEFAULT_LEASE_MS
from souq.jobs.queue import JobQueue
from souq.model.job import (
    JOB_NAME,
    JOB_NAME_MAX,
    Job,
    JobEvent,
    JobState,
    JobStopped,
    JobSubmit,
    Registration,
)

__all__ = ["sched_router"]

JobName = Annotated[
    str, Path(pattern=JOB_NAME, max_length=JOB_NAME_MAX, description="the job's name")
]
Worker = Annotated[str | None, Query(pattern=JOB_NAME, max_length=JOB_NAME_MAX)]
WorkerHeader = Annotated[str | None, Header(alias="X-Souq-Worker")]


def _claimant(worker: Worker = None, x_souq_worker: WorkerHeader = None) -> str | None:
    """Who asks: ``?worker=``, else the ``X-Souq-Worker`` header (None: anyone, as in the seed)."""
    return worker or x_souq_worker


Claimant = Annotated[str | None, Depends(_claimant)]
Attempt = Annotated[int | None, Query(ge=1, description="which run (default: the last)")]
LeaseS = Annotated[float, Query(gt=0, le=3600, description="the claim's lease, seconds")]


def sched_router(queue: JobQueue) -> APIRouter:
    router = APIRouter(prefix="/sched", tags=["jobs"])

    async def change(
        name: str,
        event: JobEvent,
        worker: str | None,
        *,
        lease_s: float = DEFAULT_LEASE_MS / 1000,
        stopped: JobStopped | None = None,
    ) -> Response:
        store = await queue.store()
        job = await store.change(
            name, event, worker=worker, lease_ms=int(lease_s * 1000), stopped=stopped
        )
        return json_response(job)

    @router.post(
        "/submit", status_code=201, response_model=Job, openapi_extra=body_schema(JobSubmit)
    )
    async def submit(request: Request) -> Response:
        """Queue a named job; 409 ``job_exists`` when the name is taken."""
        spec = await parse_body(request, JobSubmit)
        return json_response(await (await queue.store()).submit(spec), status_code=201)

    @router.get("/status/{name}", response_model=Job)
    async def status(name: JobName) -> Response:
        return json_response(await (await queue.store()).get(name))

    @router.post("/cancel/{name}", response_model=Job)
    async def cancel(name: JobName) -> Response:
        """A waiting job is cancelled at once; a running one when its worker has stopped it."""
        return await change(name, JobEvent.CANCEL, None)

    @router.get(
        "/logs/{name}",
        response_class=PlainTextResponse,
        responses={404: {"description": "no such job (job_not_found), or no output yet"}},
    )
    async def logs(name: JobName, attempt: Attempt = None) -> Response:
        """What the job's last run printed (stdout and stderr, the last MiB), as text, or run
        ``?attempt=N``'s; the run is named by the ``X-Souq-Attempt`` header. 404
        ``job_not_found`` for a job that does not exist, ``not_found`` while no run of it (or
        not that one) has ended."""
        job = await (await queue.store()).get(name)
        outputs = await queue.outputs()
        if attempt is None:
            attempt, data = await outputs.last(job)
        elif (found := await outputs.get(name, attempt)) is not None:
            data = found
        else:
            raise NotFound(
                f"run {attempt} of job {name} has no output kept",
                hint=f"the job has had {job.attempts} runs; a run's output is kept when it ends",
            )
        return Response(
            content=data,
            media_type="text/plain; charset=utf-8",
            headers={"X-Souq-Attempt": str(attempt)},
        )

    @router.get("/jobs", response_model=list[Job])
    async def waiting() -> Response:
        """The jobs a worker may claim now, oldest first."""
        store = await queue.store()
        now = store.clock.now_ms()
        jobs = [
            j for j in await store.all() if j.state is JobState.PENDING and j.not_before_ms <= now
        ]
        jobs.sort(key=lambda j: (j.submitted_ms, j.name))
        return json_response(jobs)

    @router.get("/list", response_model=list[Job])
    async def every() -> Response:
        """Every job the queue holds, ended ones included, newest first."""
        jobs = await (await queue.store()).all()
        jobs.sort(key=lambda j: (-j.submitted_ms, j.name))
        return json_response(jobs)

    @router.post("/claim/{name}", response_model=Job)
    async def claim(
        name: JobName,
        who: Claimant,
        lease_s: LeaseS = 30,
    ) -> Response:
        """200 to exactly one claimant; 409 ``illegal_transition`` to every other."""
        return await change(name, JobEvent.CLAIM, who, lease_s=lease_s)

    @router.post(
        "/release/{name}",
        response_model=Job,
        openapi_extra=body_schema(JobStopped, required=False),
    )
    async def release(name: JobName, request: Request, who: Claimant) -> Response:
        """The claimant's run ended, as the seed's worker says it: ``{"exit_code": N}`` (no
        body: it succeeded). The job does not run again unless its restart policy asks."""
        body = await parse_body(request, JobStopped, optional=True)
        return await change(name, JobEvent.RELEASE, who, stopped=body)

    @router.post("/return/{name}", response_model=Job)
    async def give_back(name: JobName, who: Claimant) -> Response:
        """The claimant gives the job back untouched: waiting again, no run counted."""
        return await change(name, JobEvent.RETURN, who)

    @router.post("/renew/{name}", response_model=Job)
    async def renew(
        name: JobName,
        who: Claimant,
        lease_s: LeaseS = 30,
    ) -> Response:
        return await change(name, JobEvent.RENEW, who, lease_s=lease_s)

    @router.get("/cancellations", response_model=list[Job])
    async def cancellations(who: Claimant) -> Response:
        """Held jobs whose cancel was asked (the worker's, when it names itself): stop them."""
        jobs = [
            j
            for j in await (await queue.store()).all()
            if j.cancel_requested and not j.state.ended and (who is None or j.worker == who)
        ]
        return json_response(jobs)

    @router.post("/register", response_model=Registration, openapi_extra=body_schema(Registration))
    async def register(request: Request) -> Response:
        """A worker of the push model says what it has free; it then asks ``/sched/assigned``."""
        body = await parse_body(request, Registration)
        return json_response(await (await queue.store()).register(body))

    @router.get("/assigned", response_model=list[Job])
    async def assigned(who: Claimant) -> Response:
        """The jobs the registered worker holds, after it is given the waiting ones that fit
        what it registered as free (oldest first)."""
        return json_response(await (await queue.store()).assign(who or ""))

    @router.post("/started/{name}", response_model=Job)
    async def started(name: JobName, who: Claimant) -> Response:
        return await change(name, JobEvent.START, who)

    @router.post(
        "/stopped/{name}",
        response_model=Job,
        openapi_extra=body_schema(JobStopped, required=False),
    )
    async def stopped(name: JobName, request: Request, who: Claimant) -> Response:
        """How the run ended: ``{"exit_code": N, "error": "..."}`` (no body: it succeeded)."""
        body = await parse_body(request, JobStopped, optional=True)
        return await change(name, JobEvent.STOP, who, stopped=body)

    return router
