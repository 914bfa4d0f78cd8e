"""The fixed sets of values Souq's records take, each written once: the model validates with
them and the command line offers exactly them (:mod:`souq.client.options`). Pure, and light:
it imports no pydantic, so a command line can be built without the records."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

__all__ = [
    "RUN_STARTS",
    "Autostop",
    "Driver",
    "EventType",
    "FitPolicy",
    "JobRestart",
    "JobState",
    "MachineState",
    "PriorityClass",
    "RestartPolicy",
    "ScopeName",
    "Strategy",
]


class MachineState(StrEnum):
    CREATED = "created"
    STARTING = "starting"
    STARTED = "started"
    STOPPING = "stopping"
    STOPPED = "stopped"
    SUSPENDED = "suspended"  # frozen: keeps its memory and its port, resumes on `start`
    DESTROYING = "destroying"
    DESTROYED = "destroyed"
    FAILED = "failed"


class EventType(StrEnum):
    """What a machine's event record says happened (its ``type``, as Fly's machine events name
    them): what the agent publishes, keeps in its ``events`` table and shows in the API. The
    agent's steps name them through one table (:data:`souq.agent.state.events.PUBLISHED`)."""

    LAUNCH = "launch"  # the machine was made
    STANDBY = "standby"  # made stopped: it waits until a primary's worker is lost
    START = "start"
    STOP = "stop"
    RESTART = "restart"  # a user's restart, or the restart policy's
    SUSPEND = "suspend"
    RESUME = "resume"
    SIGNAL = "signal"  # a user's signal, or the SIGKILL after a stop's timeout
    EXIT = "exit"  # its process ended
    FAIL = "fail"  # its process could not be started
    PULL = "pull"  # its image was pulled
    UPDATE = "update"  # its config was replaced
    METADATA = "metadata"
    CORDON = "cordon"  # out of the proxies' rotation
    UNCORDON = "uncordon"
    PREEMPT_NOTICE = "preempt_notice"  # a spot machine priced out: it stops after a notice
    PREEMPTED = "preempted"  # displaced by another machine, or priced out
    DESTROY = "destroy"  # a destroy began, or ended


# The events that begin a run of a machine (its making counts as one): "since its last start".
RUN_STARTS = (EventType.LAUNCH, EventType.START, EventType.RESTART)


class PriorityClass(StrEnum):
    """How much a machine (or a batch job) may be displaced to make room for another
    (:mod:`souq.market.preemption`)."""

    RESERVED = "reserved"  # never displaced; may displace standard and spot
    STANDARD = "standard"  # displaced only by reserved; may displace spot
    SPOT = "spot"  # displaced by either; displaces nobody


class RestartPolicy(StrEnum):
    NO = "no"
    ON_FAILURE = "on-failure"
    ALWAYS = "always"


class JobState(StrEnum):
    PENDING = "pending"  # waiting for a worker (or for its backoff to pass)
    CLAIMED = "claimed"  # a worker took it and holds its lease
    RUNNING = "running"  # the worker started it
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # out of retries, or past its deadline
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class Strategy(StrEnum):
    """How a deploy replaces an app's machines (docs/apps.md): the one list of strategies, which
    souq.toml's ``[deploy] strategy``, a new release and ``souq deploy --strategy`` all take."""

    ROLLING = "rolling"  # a few at a time, each healthy before the next
    CANARY = "canary"  # one per group first, then rolling
    BLUEGREEN = "bluegreen"  # all new ones healthy, then the old ones go
    IMMEDIATE = "immediate"  # all at once, no health waits


# How a job runs again: never, or after a non-zero exit.
JobRestart = Literal["no", "on-failure"]


# What the proxy does to an idle machine of a service.
Autostop = Literal["off", "stop", "suspend"]


# How the offers for a machine rank: the fit scorers, and "random".
FitPolicy = Literal[
    "best-fit",
    "binpack",
    "spread",
    "fgd",
    "leftover",
    "dotprod",
    "gpupacking",
    "gpuclustering",
    "random",
]
# An API token's scope (souq.auth.tokens.Scope: what each includes).
ScopeName = Literal["read", "write", "deploy", "admin", "queue"]


class Driver(StrEnum):
    """How a machine runs on its worker: isolated (``sandbox``) or a plain process."""

    SANDBOX = "sandbox"
    EXEC = "exec"
