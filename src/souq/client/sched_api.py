"""The client's calls of the ``/sched`` API (batch jobs, docs/jobs.md): a part of
:class:`souq.client.api.SouqClient`, kept apart as the machines' calls fill that module.

A worker names itself with ``worker`` (sent as ``?worker=``); without a name anyone may act on
a job, as in the seed's API.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx

from souq import model as records
from souq.client.session import ApiSession
from souq.errors import JobNotFound, NotFound, WaitTimeout

if TYPE_CHECKING:  # a record loads when a call first reads one (souq.model is lazy)
    from pydantic import TypeAdapter

    from souq.model.job import Job, JobStopped, JobSubmit, PeriodicJob, Registration

__all__ = ["SchedCalls"]
WAIT_FIRST_S = 0.1  # a wait asks again after this, doubling up to WAIT_EVERY_S
WAIT_EVERY_S = 1.0


@functools.cache
def _jobs() -> TypeAdapter[list[Job]]:
    from pydantic import TypeAdapter

    return TypeAdapter(list[records.Job])


class SchedCalls(ApiSession):
    """The ``/sched`` routes, over :meth:`ApiSession._call` (the client's one way to the API)."""

    # -- users ---------------------------------------------------------------------------

    def submit_job(self, spec: JobSubmit | Mapping[str, Any]) -> Job:
        """Queue a job (``JobSubmit``'s fields; only ``name`` and ``command`` are required);
        :class:`souq.errors.JobExists` when the name is taken."""
        body = spec.model_dump(mode="json") if isinstance(spec, records.JobSubmit) else dict(spec)
        return _job(self._call("POST", "/sched/submit", json=body))

    def job(self, name: str) -> Job:
        return _job(self._call("GET", f"/sched/status/{name}"))

    def cancel_job(self, name: str) -> Job:
        """A waiting job ends ``cancelled`` at once; a held one is asked to stop
        (``cancel_requested``) and ends when its worker has stopped it."""
        return _job(self._call("POST", f"/sched/cancel/{name}"))

    def submit_periodic(self, spec: Mapping[str, Any]) -> PeriodicJob:
        """A periodic job (``spec`` with ``cron``): its runs are queued at its times."""
        from souq.model.job import PeriodicJob

        return PeriodicJob.model_validate_json(
            self._call("POST", "/sched/submit", json=dict(spec)).content
        )

    def periodic_jobs(self, *, app: str | None = None) -> list[PeriodicJob]:
        """The periodic jobs the token may read, with their recent runs."""
        from pydantic import TypeAdapter

        from souq.model.job import PeriodicJob

        params = {"app": app} if app else None
        got = self._call("GET", "/sched/periodic", params=params).content
        return TypeAdapter(list[PeriodicJob]).validate_json(got)

    def periodic_job(self, name: str) -> PeriodicJob:
        from souq.model.job import PeriodicJob

        got = self._call("GET", f"/sched/periodic/{name}").content
        return PeriodicJob.model_validate_json(got)

    def delete_periodic(self, name: str) -> PeriodicJob:
        """No more runs of ``name`` are queued (the ones queued stay)."""
        from souq.model.job import PeriodicJob

        got = self._call("DELETE", f"/sched/periodic/{name}").content
        return PeriodicJob.model_validate_json(got)

    def jobs(self, *, app: str | None = None) -> list[Job]:
        """Every job the queue holds that the token may read (``app``'s only, when given),
        ended ones too, newest first."""
        params = {"app": app} if app else None
        return _jobs().validate_json(self._call("GET", "/sched/list", params=params).content)

    def job_logs(self, name: str) -> str:
        """What the job's runs printed (``GET /sched/logs/{name}``)."""
        try:
            return self._call("GET", f"/sched/logs/{name}").text
        except JobNotFound:
            raise
        except NotFound as exc:  # the route itself: a broker from before job logs
            raise NotFound(
                "this broker keeps no job logs (it has no GET /sched/logs)",
                hint=f"a job's worker keeps its output; `souq job status {name}` shows how it "
                "ended",
            ) from exc

    def wait_job(self, name: str, *, timeout: float = 60.0) -> Job:
        """The job once it has ended (succeeded, failed or cancelled);
        :class:`souq.errors.WaitTimeout` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        pause = WAIT_FIRST_S
        while True:
            job = self.job(name)
            left = deadline - time.monotonic()
            if job.state.ended:
                return job
            if left <= 0:
                raise WaitTimeout(
                    f"job {name} is still {job.state} after {timeout:g}s ({job.why})",
                    hint=f"wait longer (--timeout), or see `souq job status {name}`",
                    details={"state": str(job.state)},
                )
            time.sleep(min(pause, left))
            pause = min(pause * 2, WAIT_EVERY_S)

    # -- pulling workers -----------------------------------------------------------------

    def waiting_jobs(self, *, app: str | None = None) -> list[Job]:
        """The jobs a worker may claim now (of the apps its token works, ``app``'s only when
        given), oldest first."""
        params = {"app": app} if app else None
        return _jobs().validate_json(self._call("GET", "/sched/jobs", params=params).content)

    def claim_job(self, name: str, *, worker: str | None = None, lease_s: float = 30.0) -> Job:
        """The job, leased to ``worker``; :class:`souq.errors.IllegalTransition` (409) when
        another claimant won it."""
        params = _who(worker) | {"lease_s": f"{lease_s:g}"}
        return _job(self._call("POST", f"/sched/claim/{name}", params=params))

    def renew_job(self, name: str, *, worker: str | None = None, lease_s: float = 30.0) -> Job:
        params = _who(worker) | {"lease_s": f"{lease_s:g}"}
        return _job(self._call("POST", f"/sched/renew/{name}", params=params))

    def release_job(
        self, name: str, *, worker: str | None = None, exit_code: int = 0, error: str = ""
    ) -> Job:
        """The run ended (the seed's word): the job ends, or runs again if its restart policy
        asks."""
        return self._ended(
            "release", name, worker, records.JobStopped(exit_code=exit_code, error=error)
        )

    def return_job(self, name: str, *, worker: str | None = None) -> Job:
        """Give the job back untouched: waiting again, no run counted."""
        return _job(self._call("POST", f"/sched/return/{name}", params=_who(worker)))

    def cancellations(self, *, worker: str | None = None) -> list[Job]:
        """Held jobs (``worker``'s, when given) whose cancel was asked: stop them."""
        response = self._call("GET", "/sched/cancellations", params=_who(worker))
        return _jobs().validate_json(response.content)

    # -- registered workers (and any worker running a job it holds) ----------------------

    def register_worker(self, registration: Registration) -> Registration:
        body = registration.model_dump(mode="json")
        response = self._call("POST", "/sched/register", json=body)
        return records.Registration.model_validate_json(response.content)

    def assigned_jobs(self, worker: str) -> list[Job]:
        response = self._call("GET", "/sched/assigned", params=_who(worker))
        return _jobs().validate_json(response.content)

    def job_started(self, name: str, *, worker: str | None = None) -> Job:
        return _job(self._call("POST", f"/sched/started/{name}", params=_who(worker)))

    def job_stopped(
        self, name: str, *, worker: str | None = None, exit_code: int = 0, error: str = ""
    ) -> Job:
        return self._ended(
            "stopped", name, worker, records.JobStopped(exit_code=exit_code, error=error)
        )

    def _ended(self, verb: str, name: str, worker: str | None, stopped: JobStopped) -> Job:
        body = stopped.model_dump(mode="json")
        return _job(self._call("POST", f"/sched/{verb}/{name}", json=body, params=_who(worker)))


def _who(worker: str | None) -> dict[str, str]:
    return {"worker": worker} if worker else {}


def _job(response: httpx.Response) -> Job:
    return records.Job.model_validate_json(response.content)
