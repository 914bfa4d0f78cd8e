"""How an agent takes and runs a batch job, as decisions: pure, the shell is
:mod:`souq.agent.jobs.runner`.

**Taking a name.** An agent with a free slot fetches one name from the ready stream and
:func:`judge` says what to do with it: ``take`` it (claim it), ``drop`` it (ack: the job is not
waiting any more, it comes back with a new name if it ever waits again) or put it back ``later``
(nak with a delay: its backoff has not passed, or it does not fit here now; another worker may
take it meanwhile).

**Its lease** (:class:`LeaseTimes`). A claim is leased for ``lease``; the worker renews it every
``lease/3`` while the job runs. A renewal that is refused means the queue gave the job to
someone else, or ended it: the run is *fenced* (killed, its end not reported). Renewals that do
not get through (NATS away) are tried again until ``lease - lease/4`` after the start of the
last one that did; then the run is fenced too, and killed within ``lease/8`` (SIGTERM, then
SIGKILL). The queue requeues a job only once its lease has ended (a broker's sweep), so the
next run of a job starts after this one is dead: two runs never overlap, as long as the
agent's and the brokers' clocks agree to within ``lease/8``.

**A run** is a table, ``(state, event) → (next state, actions)``::

    state        exited           cancel asked     shutdown         lease lost / ending
    running      ended: keep      cancelling:      returning:       fenced: fence
                 output, stop     terminate        terminate
    cancelling   ended: keep      —                —                fenced: fence
                 output, stop
    returning    ended: keep      cancelling       —                fenced: fence
                 output, return
    fenced       ended: keep      —                —                —
                 output, return
    ended        —                —                —                —

(— : no change, no action.) ``keep output`` puts the run's output in the object store before
the end is told, so a job that ended has it; ``stop`` reports the exit to the queue (a
cancelled job's stop makes it cancelled), ``return`` gives it back (refused, harmlessly, when
the queue has moved it on already), ``terminate`` is SIGTERM and SIGKILL after
:data:`STOP_GRACE_S`, ``fence`` the same after ``lease/8``. The lease is renewed in
``running``, ``cancelling`` and ``returning``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from souq.errors import IllegalTransition
from souq.model.job import Job, JobState

__all__ = [
    "RENEWING",
    "STOP_GRACE_S",
    "TRANSITIONS",
    "Action",
    "Judgement",
    "LeaseTimes",
    "RunEvent",
    "RunState",
    "Verdict",
    "judge",
    "later_delay_s",
    "transition",
]

STOP_GRACE_S = 5.0  # SIGTERM to SIGKILL, for a cancel or the agent's shutdown
KILL_GRACE_MAX_S = 5.0  # ... and at most this when fenced (lease/8 below)
LATER_BASE_S = 0.25  # a name that does not fit here: back after this, doubling per delivery
LATER_MAX_S = 2.0


class Verdict(StrEnum):
    TAKE = "take"
    DROP = "drop"
    LATER = "later"


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    why: str
    delay_s: float = 0.0


def later_delay_s(deliveries: int, jitter: float = 0.5) -> float:
    """How long a name that does not fit waits before it is offered again, by how many times
    it was delivered: 0.25 s doubling to 2 s, so a job that fits nowhere costs little and one
    that fits elsewhere is soon offered to the other workers. ``jitter`` (0 to 1) spreads it
    from half to one and a half times that: names put back together would otherwise come back
    together, to the same workers in the same order, and a job that fits one worker only could
    be offered to the others for ever."""
    return min(LATER_MAX_S, LATER_BASE_S * float(2 ** max(deliveries - 1, 0))) * (0.5 + jitter)


def judge(
    job: Job | None, now_ms: int, *, short: str | None, deliveries: int = 1, jitter: float = 0.5
) -> Judgement:
    """What to do with a fetched name: its job as the queue holds it (None: gone), and why it
    does not fit this worker now (``short``, None when it fits); ``jitter`` as
    :func:`later_delay_s` takes it."""
    if job is None:
        return Judgement(Verdict.DROP, "no such job")
    if job.state is not JobState.PENDING:
        return Judgement(Verdict.DROP, f"it is {job.state}")
    deadline = job.deadline_ms
    if deadline is not None and now_ms >= deadline:
        return Judgement(Verdict.DROP, "its deadline passed (the sweep fails it)")
    if job.not_before_ms > now_ms:
        wait = (job.not_before_ms - now_ms) / 1000
        return Judgement(Verdict.LATER, f"its backoff ends in {wait:.3f} s", wait)
    if short is not None:
        delay = later_delay_s(deliveries, jitter)
        return Judgement(Verdict.LATER, f"it does not fit: {short}", delay)
    return Judgement(Verdict.TAKE, "it waits and fits")


@dataclass(frozen=True)
class LeaseTimes:
    """The times a run keeps to, from its lease (seconds)."""

    lease_s: float

    @property
    def renew_every_s(self) -> float:
        return self.lease_s / 3

    @property
    def fence_after_s(self) -> float:
        """From the start of the last renewal that got through to the fence."""
        return self.lease_s - self.lease_s / 4

    @property
    def kill_grace_s(self) -> float:
        """From the fence's SIGTERM to its SIGKILL: dead well before the lease ends."""
        return min(KILL_GRACE_MAX_S, self.lease_s / 8)

    @property
    def retry_s(self) -> float:
        """Between renewals that did not get through."""
        return min(1.0, self.lease_s / 12)


class RunState(StrEnum):
    RUNNING = "running"
    CANCELLING = "cancelling"  # its cancel was asked (or its deadline passed): stopping it
    RETURNING = "returning"  # the agent shuts down: stopping it, to give it back
    FENCED = "fenced"  # its lease is lost (or about to be): killing it, reporting nothing
    ENDED = "ended"


class RunEvent(StrEnum):
    EXITED = "exited"
    CANCEL_ASKED = "cancel_asked"
    SHUTDOWN = "shutdown"
    LEASE_LOST = "lease_lost"  # a renewal refused: the queue moved the job on
    LEASE_ENDING = "lease_ending"  # no renewal got through before the fence
    PREEMPTED = "preempted"  # a machine of a higher class took its room: stop it, give it back


class Action(StrEnum):
    TERMINATE = "terminate"  # SIGTERM, SIGKILL after STOP_GRACE_S
    FENCE = "fence"  # SIGTERM, SIGKILL after LeaseTimes.kill_grace_s
    STOP = "stop"  # tell the queue how it ended
    RETURN = "return"  # give it back to the queue
    KEEP_OUTPUT = "keep_output"  # its output to the object store


RENEWING = frozenset({RunState.RUNNING, RunState.CANCELLING, RunState.RETURNING})

_S, _E, _A = RunState, RunEvent, Action
_LOST = ((_E.LEASE_LOST, _S.FENCED, (_A.FENCE,)), (_E.LEASE_ENDING, _S.FENCED, (_A.FENCE,)))
_QUIET = (_E.CANCEL_ASKED, _E.SHUTDOWN, _E.LEASE_LOST, _E.LEASE_ENDING, _E.PREEMPTED)

TRANSITIONS: dict[tuple[RunState, RunEvent], tuple[RunState, tuple[Action, ...]]] = {
    (_S.RUNNING, _E.EXITED): (_S.ENDED, (_A.KEEP_OUTPUT, _A.STOP)),
    (_S.RUNNING, _E.CANCEL_ASKED): (_S.CANCELLING, (_A.TERMINATE,)),
    (_S.RUNNING, _E.SHUTDOWN): (_S.RETURNING, (_A.TERMINATE,)),
    (_S.RUNNING, _E.PREEMPTED): (_S.RETURNING, (_A.TERMINATE,)),
    (_S.CANCELLING, _E.PREEMPTED): (_S.CANCELLING, ()),
    (_S.RETURNING, _E.PREEMPTED): (_S.RETURNING, ()),
    (_S.CANCELLING, _E.EXITED): (_S.ENDED, (_A.KEEP_OUTPUT, _A.STOP)),
    (_S.CANCELLING, _E.CANCEL_ASKED): (_S.CANCELLING, ()),
    (_S.CANCELLING, _E.SHUTDOWN): (_S.CANCELLING, ()),
    (_S.RETURNING, _E.EXITED): (_S.ENDED, (_A.KEEP_OUTPUT, _A.RETURN)),
    (_S.RETURNING, _E.CANCEL_ASKED): (_S.CANCELLING, ()),
    (_S.RETURNING, _E.SHUTDOWN): (_S.RETURNING, ()),
    (_S.FENCED, _E.EXITED): (_S.ENDED, (_A.KEEP_OUTPUT, _A.RETURN)),
    **{(state, event): (_S.FENCED, actions) for state in RENEWING for event, _, actions in _LOST},
    **{(_S.FENCED, event): (_S.FENCED, ()) for event in _QUIET},
    **{(_S.ENDED, event): (_S.ENDED, ()) for event in RunEvent},
}


def transition(state: RunState, event: RunEvent) -> tuple[RunState, tuple[Action, ...]]:
    """The run's next state and what to do; :class:`IllegalTransition` for a pair the table
    does not hold."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(
            f"a job run that is {state} has no transition on {event}",
            hint="see souq.agent.jobs.rules for the table",
            details={"state": str(state), "event": str(event)},
        ) from None
