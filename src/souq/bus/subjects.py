"""Every NATS subject Souq uses, in one place.

=================================  =====================  ==========================================
subject                            pattern                what travels
=================================  =====================  ==========================================
``souq.offers.<region>``           scatter-gather         request for offers -> one Offer per worker
``souq.worker.<worker>.<verb>``    request/reply          claim and machine commands to one worker
``souq.all.<verb>``                scatter-gather         list / locate, answered by every worker
``souq.hb.<region>.<worker>``      publish                heartbeat (WorkerInfo), every interval
``souq.evt.<region>.<worker>``     publish                machine events (state changes)
``souq.use.<region>.<worker>``     publish                the worker's usage, when it changes
``souq.jobevt.<region>.<worker>``  publish                batch job runs started and stopped
``souq.discover``                  publish                "heartbeat now": a new broker asks
``souq.jobs.ready``                JetStream stream       the names of batch jobs ready to claim
``souq.audit.<app>``               JetStream stream       the audit log's entries, by app
=================================  =====================  ==========================================

Nothing else in Souq spells one of these (``tests/unit/test_one_place.py`` pins it).
"""

from __future__ import annotations

__all__ = [
    "ALL_HEARTBEATS",
    "ALL_JOB_EVENTS",
    "ALL_WORKER_VERBS",
    "AUDIT",
    "DISCOVER",
    "JOBS_READY",
    "all_workers",
    "events",
    "heartbeat",
    "job_events",
    "offers",
    "usage",
    "worker",
    "worker_verbs",
]

PREFIX = "souq"
DISCOVER = f"{PREFIX}.discover"
ALL_HEARTBEATS = f"{PREFIX}.hb.>"
ALL_EVENTS = f"{PREFIX}.evt.>"
ALL_USAGE = f"{PREFIX}.use.>"
ALL_JOB_EVENTS = f"{PREFIX}.jobevt.>"
ALL_WORKER_VERBS = f"{PREFIX}.worker.*.*"  # every verb to every worker (the hollow fleet's one)
JOBS_READY = f"{PREFIX}.jobs.ready"  # the subject of the batch queue's ready stream
AUDIT = f"{PREFIX}.audit"  # the audit log's stream takes AUDIT.<app>


def _token(value: str) -> str:
    if not value or any(c in value for c in ". *>\t\r\n"):
        raise ValueError(f"{value!r} cannot be used in a subject")
    return value


def offers(region: str) -> str:
    return f"{PREFIX}.offers.{_token(region)}"


def worker(worker_id: str, verb: str) -> str:
    return f"{PREFIX}.worker.{_token(worker_id)}.{_token(verb)}"


def worker_verbs(worker_id: str) -> str:
    """Wildcard a worker subscribes to for every verb addressed to it."""
    return f"{PREFIX}.worker.{_token(worker_id)}.*"


def all_workers(verb: str) -> str:
    return f"{PREFIX}.all.{_token(verb)}"


def heartbeat(region: str, worker_id: str) -> str:
    return f"{PREFIX}.hb.{_token(region)}.{_token(worker_id)}"


def events(region: str, worker_id: str) -> str:
    return f"{PREFIX}.evt.{_token(region)}.{_token(worker_id)}"


def job_events(region: str, worker_id: str) -> str:
    """A worker's batch job runs (:class:`souq.model.job.JobRunEvent`)."""
    return f"{PREFIX}.jobevt.{_token(region)}.{_token(worker_id)}"


def usage(region: str, worker_id: str) -> str:
    return f"{PREFIX}.use.{_token(region)}.{_token(worker_id)}"


def verb_of(subject: str) -> str:
    """The last token of a subject: the verb of a worker command."""
    return subject.rsplit(".", 1)[-1]
