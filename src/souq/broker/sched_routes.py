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

Every job belongs to an app (the submitting token's, or the body's ``app`` for a token of every
app, else :data:`~souq.model.job.DEFAULT_QUEUE`), and every route checks the token against the
job's app, as the machines' routes check their path's: ``read`` to see a job (its status, its
output, the lists, which hold only the jobs the token may read), ``write`` to submit or cancel
one, ``queue`` (which ``deploy`` includes) to work the queue: the waiting jobs, claim, renew,
started, stopped, release, return, cancellations, register, assigned. A job another app's token
asks for is ``404 job_not_found``, as if it did not exist. A job's ``env`` values are shown only
to a token that may work its queue (a worker runs the job with them) or read its app's secrets;
to any other they are ``[redacted]``, as a machine's secrets are never shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import PlainTextResponse, Response

from souq.auth.access import Permit, permit_of
from souq.auth.tokens import Scope
from souq.broker.bodies import body_schema, json_response, parse_body
from souq.broker.periodic_routes import periodic_routes, shown_periodic
from souq.errors import Forbidden, JobNotFound, NotFound
from souq.jobs.core import DEFAULT_LEASE_MS
from souq.jobs.queue import JobQueue
from souq.jobs.store import JobStore
from souq.model import APP_NAME_PATTERN
from souq.model.job import (
    DEFAULT_QUEUE,
    JOB_NAME,
    JOB_NAME_MAX,
    Job,
    JobEvent,
    JobState,
    JobStopped,
    JobSubmit,
    PeriodicJob,
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


def _permit(request: Request) -> Permit:
    return permit_of(request.scope.get("state"))


Claimant = Annotated[str | None, Depends(_claimant)]
Allowed = Annotated[Permit, Depends(_permit)]
OfApp = Annotated[
    str | None, Query(pattern=APP_NAME_PATTERN, max_length=63, description="only this app's")
]
REDACTED = "[redacted]"
Attempt = Annotated[int | None, Query(ge=1, description="which run (default: the last)")]
LeaseS = Annotated[float, Query(gt=0, le=3600, description="the claim's lease, seconds")]


@dataclass(frozen=True, slots=True)
class _Step:
    """A step on one job: the job's name, the worker that takes it (None: anyone, as in the
    seed) and the token's permit."""

    name: str
    worker: str | None
    permit: Permit


async def _step(name: JobName, who: Claimant, permit: Allowed) -> _Step:
    return _Step(name, who, permit)


WorkerStep = Annotated[_Step, Depends(_step)]  # a worker's route on /sched/<verb>/{name}


def sched_router(queue: JobQueue) -> APIRouter:
    router = APIRouter(prefix="/sched", tags=["jobs"])
    _users_routes(router, queue)
    _workers_routes(router, queue)
    return router


async def _change(
    queue: JobQueue,
    step: _Step,
    event: JobEvent,
    *,
    needs: Scope = Scope.QUEUE,
    lease_s: float = DEFAULT_LEASE_MS / 1000,
    stopped: JobStopped | None = None,
) -> Response:
    store = await queue.store()
    await job_of(store, step.name, step.permit, needs)  # a job's app never changes
    job = await store.change(
        step.name, event, worker=step.worker, lease_ms=int(lease_s * 1000), stopped=stopped
    )
    return json_response(shown(job, step.permit))


def _users_routes(router: APIRouter, queue: JobQueue) -> None:
    @router.post(
        "/submit",
        status_code=201,
        response_model=Job | PeriodicJob,
        openapi_extra=body_schema(JobSubmit),
    )
    async def submit(request: Request, permit: Allowed) -> Response:
        """Queue a named job; 409 ``job_exists`` when the name is taken. With ``cron``: a
        periodic job, whose runs are queued at its times (the answer is its record)."""
        spec = await parse_body(request, JobSubmit)
        app = app_of(permit, spec.app, Scope.WRITE)
        spec = spec.model_copy(update={"app": app})
        if spec.cron is not None:
            record = PeriodicJob(name=spec.name, app=app, spec=spec, created_ms=0)
            made = await (await queue.periodic()).create(record)
            return json_response(shown_periodic(made, permit), status_code=201)
        job = await (await queue.store()).submit(spec)
        return json_response(shown(job, permit), status_code=201)

    periodic_routes(router, queue)

    @router.get("/status/{name}", response_model=Job)
    async def status(name: JobName, permit: Allowed) -> Response:
        return json_response(shown(await job_of(await queue.store(), name, permit), permit))

    @router.post("/cancel/{name}", response_model=Job)
    async def cancel(name: JobName, permit: Allowed) -> Response:
        """A waiting job is cancelled at once; a running one when its worker has stopped it."""
        return await _change(queue, _Step(name, None, permit), JobEvent.CANCEL, needs=Scope.WRITE)

    @router.get(
        "/logs/{name}",
        response_class=PlainTextResponse,
        responses={404: {"description": "no such job (job_not_found), or no output yet"}},
    )
    async def logs(name: JobName, permit: Allowed, attempt: Attempt = None) -> Response:
        """What the job's last run printed (stdout and stderr, the last MiB), as text, or run
        ``?attempt=N``'s; the run is named by the ``X-Souq-Attempt`` header. 404
        ``job_not_found`` for a job that does not exist, ``not_found`` while no run of it (or
        not that one) has ended."""
        job = await job_of(await queue.store(), name, permit)
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
    async def waiting(permit: Allowed, app: OfApp = None) -> Response:
        """The jobs a worker may claim now, oldest first (of the apps whose queue the token
        may work or read)."""
        store = await queue.store()
        now = store.clock.now_ms()
        jobs = [
            j
            for j in await store.all()
            if j.state is JobState.PENDING
            and j.not_before_ms <= now
            and app in (None, j.app)
            and (permit.allows(j.app, Scope.QUEUE) or permit.allows(j.app, Scope.READ))
        ]
        jobs.sort(key=lambda j: (j.submitted_ms, j.name))
        return json_response([shown(j, permit) for j in jobs])

    @router.get("/list", response_model=list[Job])
    async def every(permit: Allowed, app: OfApp = None) -> Response:
        """Every job the queue holds that the token may read (``?app=``: of that app), ended
        ones included, newest first."""
        jobs = [
            j
            for j in await (await queue.store()).all()
            if app in (None, j.app) and permit.allows(j.app, Scope.READ)
        ]
        jobs.sort(key=lambda j: (-j.submitted_ms, j.name))
        return json_response([shown(j, permit) for j in jobs])


def _workers_routes(router: APIRouter, queue: JobQueue) -> None:
    @router.post("/claim/{name}", response_model=Job)
    async def claim(step: WorkerStep, lease_s: LeaseS = 30) -> Response:
        """200 to exactly one claimant; 409 ``illegal_transition`` to every other."""
        return await _change(queue, step, JobEvent.CLAIM, lease_s=lease_s)

    @router.post(
        "/release/{name}",
        response_model=Job,
        openapi_extra=body_schema(JobStopped, required=False),
    )
    async def release(step: WorkerStep, request: Request) -> Response:
        """The claimant's run ended, as the seed's worker says it: ``{"exit_code": N}`` (no
        body: it succeeded). The job does not run again unless its restart policy asks."""
        body = await parse_body(request, JobStopped, optional=True)
        return await _change(queue, step, JobEvent.RELEASE, stopped=body)

    @router.post("/return/{name}", response_model=Job)
    async def give_back(step: WorkerStep) -> Response:
        """The claimant gives the job back untouched: waiting again, no run counted."""
        return await _change(queue, step, JobEvent.RETURN)

    @router.post("/renew/{name}", response_model=Job)
    async def renew(step: WorkerStep, lease_s: LeaseS = 30) -> Response:
        return await _change(queue, step, JobEvent.RENEW, lease_s=lease_s)

    @router.get("/cancellations", response_model=list[Job])
    async def cancellations(who: Claimant, permit: Allowed) -> Response:
        """Held jobs whose cancel was asked (the worker's, when it names itself), of the apps
        whose queue the token works: stop them."""
        jobs = [
            j
            for j in await (await queue.store()).all()
            if j.cancel_requested
            and not j.state.ended
            and (who is None or j.worker == who)
            and permit.allows(j.app, Scope.QUEUE)
        ]
        return json_response([shown(j, permit) for j in jobs])

    @router.post("/register", response_model=Registration, openapi_extra=body_schema(Registration))
    async def register(request: Request, permit: Allowed) -> Response:
        """A worker of the push model says what it has free, for one app's queue; it then asks
        ``/sched/assigned``."""
        body = await parse_body(request, Registration)
        app = app_of(permit, body.app, Scope.QUEUE)
        store = await queue.store()
        await _check_registered(store, body.name, permit)  # not another app's name
        return json_response(await store.register(body.model_copy(update={"app": app})))

    @router.get("/assigned", response_model=list[Job])
    async def assigned(who: Claimant, permit: Allowed) -> Response:
        """The jobs the registered worker holds, after it is given the waiting ones of its app
        that fit what it registered as free (oldest first)."""
        store = await queue.store()
        await _check_registered(store, who or "", permit)
        return json_response([shown(j, permit) for j in await store.assign(who or "")])

    @router.post("/started/{name}", response_model=Job)
    async def started(step: WorkerStep) -> Response:
        return await _change(queue, step, JobEvent.START)

    @router.post(
        "/stopped/{name}",
        response_model=Job,
        openapi_extra=body_schema(JobStopped, required=False),
    )
    async def stopped(step: WorkerStep, request: Request) -> Response:
        """How the run ended: ``{"exit_code": N, "error": "..."}`` (no body: it succeeded)."""
        body = await parse_body(request, JobStopped, optional=True)
        return await _change(queue, step, JobEvent.STOP, stopped=body)


def app_of(permit: Permit, given: str | None, needs: Scope) -> str:
    """The app a submit or a registration is for: the one given, else the token's, else the
    default queue; ``403 forbidden`` unless the token may do ``needs`` on it."""
    app = given or permit.app or DEFAULT_QUEUE
    if given is None and permit.app is None and not permit.allows(app, needs):
        raise Forbidden(
            f"the token may not {needs} the default queue ({DEFAULT_QUEUE!r})",
            hint="name the app in the body's `app` (souq job submit --app APP)",
            details={"action": str(needs), "app": app},
        )
    permit.require(app, needs)
    return app


async def job_of(store: JobStore, name: str, permit: Permit, needs: Scope = Scope.READ) -> Job:
    """The job, if the token may do ``needs`` on its app: ``404 job_not_found`` when it may
    neither read the job nor work its queue (another app's job is as good as absent), ``403
    forbidden`` when it may see the job but not do that."""
    job = await store.get(name)
    if not (permit.allows(job.app, Scope.READ) or permit.allows(job.app, Scope.QUEUE)):
        raise JobNotFound(f"no job {name}", hint="`souq job list` shows the jobs")
    permit.require(job.app, needs)
    return job


async def _check_registered(store: JobStore, worker: str, permit: Permit) -> None:
    """A registered worker's name belongs to its app's queue: ``403 forbidden`` to a token that
    may not work that queue (nothing to check for a name not registered, or none)."""
    known = await store.registration(worker) if worker else None
    if known is not None:
        permit.require(known.app or DEFAULT_QUEUE, Scope.QUEUE)


def shown(job: Job, permit: Permit) -> Job:
    """The job as the token may see it: its env's values only for a token that may work its
    queue (which ``deploy`` includes: the app's secrets are its to read)."""
    if not job.spec.env or permit.allows(job.app, Scope.QUEUE):
        return job
    env = dict.fromkeys(job.spec.env, REDACTED)
    return job.model_copy(update={"spec": job.spec.model_copy(update={"env": env})})
