"""A job's changes as someone watching the queue names them: from two records of one job (what
was known of it, and the record now) to one :class:`~souq.model.job.JobChange`, or None when
nothing a reader would call a change happened (a lease renewed).

Pure. :mod:`souq.jobs.watch` feeds it every record the ``souq-jobs`` bucket stores, whoever
wrote it (a broker, an agent, a worker of the pull or the push model); the broker turns each
change into an event of its stream (``GET /v1/events``, ``kind: job``).

=========================  ==============================================================
the record now             the change
=========================  ==============================================================
pending, never changed     ``submitted``
pending, was held          ``requeued`` (returned, its lease ran out, or a retry)
claimed                    ``claimed`` (by another worker than before, or newly)
running                    ``started``
claimed or running, a      ``cancel_requested`` (a cancel, or its deadline: its worker
cancel asked newly         stops it)
succeeded, failed,         ``succeeded``, ``failed``, ``cancelled``
cancelled
=========================  ==============================================================
"""

from __future__ import annotations

from typing import NamedTuple

from souq.model.job import Job, JobChange, JobState

__all__ = ["JobMark", "change_of", "mark"]


class JobMark(NamedTuple):
    """What a watcher keeps of a job: enough to name its next change (a few bytes a job)."""

    state: JobState
    worker: str | None
    attempts: int
    cancel_requested: bool


def mark(job: Job) -> JobMark:
    return JobMark(job.state, job.worker, job.attempts, job.cancel_requested)


_ENDED = {
    JobState.SUCCEEDED: JobChange.SUCCEEDED,
    JobState.FAILED: JobChange.FAILED,
    JobState.CANCELLED: JobChange.CANCELLED,
}


def change_of(before: JobMark | None, job: Job) -> JobChange | None:
    """The change from ``before`` (None: the job was not known) to ``job``."""
    if before == mark(job):
        return None
    state = job.state
    if state in _ENDED:
        return _ENDED[state] if before is None or before.state is not state else None
    if state is JobState.PENDING:
        if before is None:
            fresh = job.updated_ms == job.submitted_ms
            return JobChange.SUBMITTED if fresh else JobChange.REQUEUED
        return JobChange.REQUEUED if before.state is not JobState.PENDING else None
    return _held(before, job)


def _held(before: JobMark | None, job: Job) -> JobChange | None:
    """A claimed or running job's change."""
    if job.cancel_requested and not (before is not None and before.cancel_requested):
        return JobChange.CANCEL_REQUESTED
    if before is not None and before.state is job.state:
        same = before.worker == job.worker and before.attempts == job.attempts
        if same:
            return None
    return JobChange.CLAIMED if job.state is JobState.CLAIMED else JobChange.STARTED
