"""Batch jobs: short tasks that wait their turn in a queue and run on whichever worker is free
(the ``/sched`` API, docs/jobs.md)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from souq.model.base import Input, Record
from souq.model.choices import JobRestart, JobState, PriorityClass
from souq.model.machine import APP_NAME_PATTERN
from souq.model.prices import MaxPrice
from souq.model.schedule import Schedule, ScheduleText, TimeZoneName, parse_schedule

__all__ = [
    "DEFAULT_QUEUE",
    "Job",
    "JobChange",
    "JobEvent",
    "JobRestart",
    "JobRunEvent",
    "JobState",
    "JobStopped",
    "JobSubmit",
    "PeriodicJob",
    "PeriodicRun",
    "Registration",
]

# A name is a key of the bucket: dots only between other characters (``a.b``, not ``a.`` nor
# ``a..b``), at most 128 characters (JOB_NAME_MAX).
JOB_NAME = r"^[a-zA-Z0-9][a-zA-Z0-9_-]*(\.[a-zA-Z0-9_-]+)*$"
JOB_NAME_MAX = 128
PERIODIC_NAME_MAX = JOB_NAME_MAX - len("-20260101T000000Z")


def _app_field(description: str) -> Any:
    """A body's optional ``app``: an app's name (None: the token's app, see ``description``)."""
    return Field(default=None, pattern=APP_NAME_PATTERN, max_length=63, description=description)


# The app of a job submitted without one by a token of every app (and of the records kept before
# jobs had apps): the cluster's default queue, worked by a token of this app's queue scope.
DEFAULT_QUEUE = "default"


class JobEvent(StrEnum):
    CLAIM = "claim"
    START = "start"
    RENEW = "renew"
    STOP = "stop"
    RELEASE = "release"  # the seed's end of a run: a stop, the run counted if never started
    RETURN = "return"  # the claimant gives the job back untouched: waiting again
    EXPIRE = "expire"
    CANCEL = "cancel"


class JobChange(StrEnum):
    """What a change of a job's record means to someone watching the queue: the ``type`` of a
    job event in the cluster's event stream (``GET /v1/events``, :mod:`souq.jobs.changes`)."""

    SUBMITTED = "submitted"
    CLAIMED = "claimed"
    STARTED = "started"
    CANCEL_REQUESTED = "cancel_requested"  # held: its worker is asked to stop it
    REQUEUED = "requeued"  # back in the queue: returned, its lease ran out, or a retry
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobSubmit(Input):
    """``POST /sched/submit``: a named job. Only ``name`` and ``command`` are required (the
    seed's API); the rest is what a queue's user expects."""

    name: str = Field(
        pattern=JOB_NAME,
        max_length=JOB_NAME_MAX,
        description="unique: a second submit of it is a 409",
    )
    command: str | list[str] = Field(
        description="a shell command line, or an argv list run without a shell"
    )
    app: str | None = _app_field(
        "the app the job belongs to (default: the token's app; for a token of every app, "
        f"{DEFAULT_QUEUE!r})"
    )
    restart: JobRestart = Field(
        default="no", description="on-failure: run it again after a non-zero exit"
    )
    max_retries: int = Field(default=3, ge=0, le=100, description="runs after the first")
    backoff_s: float = Field(
        default=1.0, ge=0, le=3600, description="wait before a retry; doubles each time"
    )
    deadline_s: float | None = Field(
        default=None,
        gt=0,
        le=7 * 86400,
        description="fail it if not finished this long after submit",
    )
    cpus: float = Field(default=0.1, ge=0, le=1024)
    memory_mb: int = Field(default=64, ge=0, le=4 * 2**20)
    env: dict[str, str] = Field(default_factory=dict, max_length=256)
    cron: ScheduleText = Field(
        default=None,
        description="a periodic job (Nomad's `periodic.cron`): a run of it is queued at each "
        "time the cron expression names (or Fly's `hourly`, `daily`, `weekly`, `monthly`), "
        f"named `NAME-YYYYMMDDTHHMMSSZ`; the name may then have {PERIODIC_NAME_MAX} characters",
    )
    time_zone: TimeZoneName = Field(
        default=None, description="the IANA time zone `cron` is read in (default UTC)"
    )
    prohibit_overlap: bool = Field(
        default=False,
        description="a periodic job: a run is not queued while the previous one has not ended "
        "(that time is skipped, and said so)",
    )
    priority_class: PriorityClass = Field(
        default=PriorityClass.STANDARD,
        description="`reserved`, `standard` or `spot`, as a machine's (docs/placement.md)",
    )
    max_price: MaxPrice = Field(
        default=None,
        description="the most it bids, per hour (none: no limit)",
    )

    @model_validator(mode="after")
    def _periodic(self) -> JobSubmit:
        if self.cron is None and (self.time_zone is not None or self.prohibit_overlap):
            raise ValueError("time_zone and prohibit_overlap are a periodic job's: give `cron`")
        if self.cron is not None and len(self.name) > PERIODIC_NAME_MAX:
            raise ValueError(
                f"name: a periodic job's name has at most {PERIODIC_NAME_MAX} characters "
                "(its runs add the time)"
            )
        return self

    def schedule(self) -> Schedule | None:
        return None if self.cron is None else parse_schedule(self.cron, self.time_zone)

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | list[str]) -> str | list[str]:
        if (isinstance(v, str) and not v.strip()) or (isinstance(v, list) and not v):
            raise ValueError("a job needs a command")
        return v


class JobStopped(Input):
    """``POST /sched/stopped/{name}`` and ``POST /sched/release/{name}``: how the run ended (an
    empty body: it succeeded)."""

    exit_code: int = Field(default=0, ge=-255, le=255)
    error: str = Field(default="", max_length=4096)


class Registration(Input):
    """``POST /sched/register``: a worker of the push model and what it has free."""

    name: str = Field(default="", pattern=r"^$|" + JOB_NAME, max_length=JOB_NAME_MAX)
    app: str | None = _app_field(
        f"the app whose jobs it runs (default: the token's app, else {DEFAULT_QUEUE!r})"
    )
    cpu: float = Field(ge=0, description="free cores")
    mem: int = Field(ge=0, description="free memory, MiB")
    diskfree: int = Field(default=0, ge=0, description="free disk, MiB")


class Job(Record):
    """A job as the queue keeps it (one key of JetStream's ``souq-jobs`` bucket)."""

    name: str
    state: JobState
    spec: JobSubmit  # the first fields, in this order: a worker in shell greps them
    app: str = Field(default=DEFAULT_QUEUE, description="the app the job belongs to")
    attempts: int = Field(default=0, description="runs started so far")
    worker: str | None = Field(
        default=None, description="who holds it (claimed, running), or held it last (ended)"
    )
    lease_until_ms: int | None = Field(default=None, description="the claim's lease ends")
    not_before_ms: int = Field(default=0, description="pending, but not claimable before")
    cancel_requested: bool = False
    submitted_ms: int
    updated_ms: int
    started_ms: int | None = None
    finished_ms: int | None = None
    exit_code: int | None = None
    error: str = ""
    why: str = Field(default="", description="the last change, in words")
    revision: int = Field(default=0, description="the store's revision of this record")
    periodic: str | None = Field(
        default=None, description="the periodic job that queued this run, and at what time"
    )
    scheduled_ms: int | None = Field(default=None, description="the time this run was due")

    @property
    def deadline_ms(self) -> int | None:
        d = self.spec.deadline_s
        return None if d is None else self.submitted_ms + int(d * 1000)


class PeriodicRun(Record):
    """One time of a periodic job: the run queued for it, or why none was."""

    at_ms: int = Field(description="the time it was due")
    job: str | None = Field(description="the run's job (None: skipped)")
    why: str
    queued_ms: int = Field(description="when it was queued (or skipped)")


class PeriodicJob(Record):
    """A periodic job (``POST /sched/submit`` with ``cron``), as JetStream's
    ``souq-jobs-periodic`` bucket keeps it: its template, and its recent runs."""

    name: str
    app: str = DEFAULT_QUEUE
    spec: JobSubmit
    explained: str = Field(default="", description="the schedule in words")
    created_ms: int
    last_due_ms: int | None = Field(default=None, description="the latest time handled")
    last_run: str | None = Field(default=None, description="the latest run's job")
    next_ms: int | None = Field(default=None, description="the next time it is due")
    runs: list[PeriodicRun] = Field(default_factory=list, description="the latest, newest first")
    revision: int = 0


class JobRunEvent(Record):
    """What an agent tells of a job run it starts and ends, on ``souq.jobevt.<region>.<worker>``
    (docs/jobs.md, "Events"). The queue's record is the truth; these say what happened where.

    ``outcome`` of a ``job.stopped``: ``exited`` (its exit was reported: ``state`` is what the
    queue made of it), ``not_started`` (its process could not start: reported as exit 127),
    ``returned`` (the agent shut down and gave it back), ``fenced`` (its lease was lost or could
    not be renewed: killed, reported by nobody; the queue requeues it once the lease ends),
    ``preempted`` (a machine of a higher class took its room, ``preempted_by``: stopped and given
    back to the queue)."""

    kind: Literal["job.started", "job.stopped"]
    name: str
    worker: str
    region: str
    attempt: int
    at_ms: int
    pid: int | None = None
    outcome: Literal["", "exited", "not_started", "returned", "fenced", "preempted"] = ""
    preempted_by: str | None = Field(default=None, description="the machine that took its room")
    exit_code: int | None = None
    signal: str | None = None
    state: JobState | None = Field(default=None, description="the job's state after the stop")
