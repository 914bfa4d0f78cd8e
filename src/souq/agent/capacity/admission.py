"""Admission: what a worker has promised, and the one place that says which claims it takes.

Pure (sans-I/O): an :class:`Admission` is the worker's ledger — its capacity, what its machines
reserve, the quotes it holds, whether it is cordoned or draining — and the rules every claim, batch
claim, hold and offer is judged by. The agent's shell asks before it records anything
(:mod:`souq.agent.verbs`, :mod:`souq.agent.machines.commands`, :mod:`souq.agent.machines.quotes`)
and tells it what it recorded (:meth:`reserve`, :meth:`release`, :meth:`hold`, :meth:`end_hold`
...). The store keeps the records; nothing in it judges capacity.

Every change of what is promised moves :attr:`Admission.version` on by one. The worker sends its
allocation with that version (heartbeats, usage messages, refusals), so a broker keeps the newest
it has heard and never goes back to an older one.

Nothing awaits between a check and the record that follows it on the agent's event loop, so a
check and its record are atomic with respect to every other claim.

The rules, in the order they are checked:

1. ``wrong_region`` — a claim for another region;
2. ``cordoned`` — a cordoned (or draining) worker takes no new machine, except one whose quote
   it already holds (the hold was made before the cordon);
3. a quote must be this app's, live (:class:`~souq.errors.QuoteExpired` when its TTL passed or it
   was released, :class:`~souq.errors.QuoteUsed` when it made its machine) and big enough;
4. ``insufficient_cpu`` / ``_memory`` / ``_disk`` / ``_gpus`` — what is asked must fit beside
   what machines reserve and live quotes hold (a batch: all of its new machines together);
   GPUs GPU by GPU: ``wrong_gpu_model``, ``insufficient_gpus`` (whole GPUs need wholly free
   ones), ``insufficient_gpu_share`` (a share needs one GPU with that much free);
5. a claim that may displace (its class allows, and the broker asked: ``preempt``) and does not
   fit is admitted if displacing machines of a lower class makes room
   (:meth:`Admission.check_preempting_claim`, :func:`souq.market.preemption.plan_eviction`): the
   plan names its victims, the shell stops them and gives their reservations back before it
   records the new machine; ``no_preemptible`` when no allowed set of victims makes room.

GPUs are accounted one by one: the ledger knows each GPU's free thousandths, and which GPUs each
machine and each hold got (:func:`souq.placement.gpus.pick` chooses them: :meth:`assign_gpus`).
The shell records the GPUs with the machine (so it can tell the machine which are its own) and
gives them back with :meth:`release`.

A machine keeps its reservation from its claim until it is destroyed (a stopped one too), but
for one case (:func:`reserves`): a machine that goes ``failed`` (its program could not be
started: nothing runs, and nothing will until someone starts it) gives its capacity back at
once, so that it does not hold room it does not use, and holds none (stopped or destroyed
meanwhile) until it starts again: that start takes it again, judged as a new machine of its size
is, on its own GPUs (:meth:`Admission.check_regain`: ``insufficient_capacity`` when the room is
gone).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from souq.clock import iso_from_ms
from souq.errors import (
    ClaimRefused,
    InsufficientCapacity,
    InvalidInput,
    NotFound,
    QuoteExpired,
    QuoteUsed,
)
from souq.market.preemption import Candidate, Eviction, plan_eviction
from souq.model.machine import MachineState
from souq.model.protocol import QuoteState
from souq.model.reasons import Reason
from souq.model.resources import GPU_MILLI, Resources
from souq.model.worker import PreemptibleRoom, WorkerState, WorkerUsage
from souq.placement import gpus
from souq.placement.gpus import gpu_shape
from souq.placement.stages import Shortfall, shortfall

__all__ = ["Admission", "HeldQuote", "reserves"]

_GIVES_BACK = frozenset({MachineState.FAILED, MachineState.DESTROYED})


def reserves(held: bool, state: MachineState) -> bool:
    """Whether a machine that held a reservation or not (``held``) holds one once in
    ``state``: failing or being destroyed gives it back; only a start takes it again."""
    return state not in _GIVES_BACK and (held or state is MachineState.STARTING)


@dataclass(frozen=True)
class HeldQuote:
    """What admission needs to know of a quote a claim names."""

    id: str
    app: str
    resources: Resources
    expires_at: int  # ms since the epoch
    state: QuoteState
    machine_id: str | None = None


@dataclass(frozen=True)
class _Hold:
    resources: Resources
    expires_at: int
    gpus: tuple[int, ...] = ()


@dataclass(kw_only=True, eq=False)
class Admission:
    worker_id: str
    region: str
    capacity: Resources
    reserved: Resources = field(default_factory=Resources.zero)
    cordoned: bool = False
    draining: bool = False
    version: int = field(default=0, init=False)
    _holds: dict[str, _Hold] = field(default_factory=dict, init=False)
    # Free thousandths of each GPU after the machines' reservations (holds not counted).
    _gpu_free: tuple[int, ...] = field(default=(), init=False)
    # GPU machines by shape (``gpu_scorers.gpu_shape``): what GpuClustering reads.
    _gpu_shapes: Counter[str] = field(default_factory=Counter, init=False)

    def __post_init__(self) -> None:
        self._gpu_free = (GPU_MILLI,) * self.capacity.gpus

    # -- what is promised ------------------------------------------------------------------

    def held(self, now_ms: int) -> Resources:
        """What live quotes hold (a quote past its expiry holds nothing, timer or not)."""
        total = Resources.zero()
        for hold in self._holds.values():
            if hold.expires_at > now_ms:
                total = total.plus(hold.resources)
        return total

    def gpu_free(self, now_ms: int | None = None) -> tuple[int, ...]:
        """Free thousandths of each GPU, by index, after reservations and live holds (every
        hold, when ``now_ms`` is None)."""
        free = self._gpu_free
        for hold in self._holds.values():
            if hold.gpus and (now_ms is None or hold.expires_at > now_ms):
                free = gpus.take(hold.resources, free, hold.gpus)
        return free

    def in_use(self, now_ms: int) -> Resources:
        """Reservations plus live holds: what a new machine must fit beside."""
        if not self._holds:
            return self.reserved
        return self.reserved.plus(self.held(now_ms))

    def usage(
        self,
        now_ms: int,
        *,
        state: WorkerState = WorkerState.UP,
        machines: int = 0,
        preemptible: list[PreemptibleRoom] | None = None,
    ) -> WorkerUsage:
        """What is promised now; ``preemptible``: what lower classes could free (the shell's
        word, :class:`souq.agent.machines.evictions.Room`; None: not said)."""
        return WorkerUsage(
            worker_id=self.worker_id,
            region=self.region,
            state=state,
            capacity=self.capacity,
            allocated=self.in_use(now_ms),
            version=self.version,
            machines=machines,
            gpu_free=list(self.gpu_free(now_ms)),
            preemptible=preemptible,
        )

    # -- the rules -------------------------------------------------------------------------

    def shortfall(self, want: Resources, now_ms: int) -> Shortfall | None:
        """Why ``want`` does not fit now (None when it does)."""
        return shortfall(want, self.capacity, self.in_use(now_ms), self.gpu_free(now_ms))

    def assign_gpus(self, want: Resources, now_ms: int | None = None) -> tuple[int, ...]:
        """The GPUs a machine of ``want`` gets now (``()``: it asks for none). Call after a
        check passed; :class:`InsufficientCapacity` if there is no room after all."""
        got = gpus.pick(want, self.gpu_free(now_ms))
        if got is None:
            raise InsufficientCapacity(
                f"no room on the GPUs of worker {self.worker_id}",
                details={"reason": Reason.INSUFFICIENT_GPUS},
            )
        return got

    def gpus_for(
        self, want: Resources, now_ms: int, *, quote_id: str | None = None
    ) -> tuple[int, ...]:
        """The GPUs a new machine of ``want`` gets: its quote's, when its hold has them, or
        the ones :meth:`assign_gpus` picks now. Call once its claim was admitted."""
        if not want.wants_gpu:
            return ()
        hold = self._holds.get(quote_id) if quote_id is not None else None
        if hold is not None and hold.gpus:
            return hold.gpus
        return self.assign_gpus(want, now_ms)

    def check_claim(
        self, region: str, want: Resources, now_ms: int, *, quote: HeldQuote | None = None
    ) -> None:
        """Raise the refusal for one new machine of ``want`` (with ``quote``'s hold, if given),
        or return: it may be recorded."""
        self._check_region(region)
        if quote is None:
            self._check_open()
            self._check_fits(want, now_ms, "the machine")
            return
        _check_quote(quote, want, now_ms)

    def plan_preemption(
        self,
        want: Resources,
        now_ms: int,
        *,
        claimant: str,
        max_victims: int,
        candidates: list[Candidate],
    ) -> Eviction | None:
        """The victims that make room for a machine of ``want`` and class ``claimant`` here
        (empty: it fits as it is); None when none would (or the worker is cordoned)."""
        if self.cordoned:
            return None
        return plan_eviction(
            want,
            capacity=self.capacity,
            in_use=self.in_use(now_ms),
            gpu_free=self.gpu_free(now_ms),
            candidates=candidates,
            claimant=claimant,
            max_victims=max_victims,
        )

    def check_preempting_claim(
        self,
        region: str,
        want: Resources,
        now_ms: int,
        *,
        claimant: str,
        max_victims: int,
        candidates: list[Candidate],
    ) -> Eviction:
        """Raise the refusal for one new machine of ``want`` that may displace machines of a
        class below ``claimant`` (at most ``max_victims``), or return whom it displaces."""
        self._check_region(region)
        self._check_open()
        plan = self.plan_preemption(
            want, now_ms, claimant=claimant, max_victims=max_victims, candidates=candidates
        )
        if plan is None:
            short = self.shortfall(want, now_ms)
            raise ClaimRefused(
                f"the machine does not fit ({short.detail if short else 'no room'}) and "
                f"displacing at most {max_victims} machines of a class below {claimant} "
                "would not make room",
                hint="another claim took the capacity first; try another worker",
                details={
                    "reason": Reason.NO_PREEMPTIBLE,
                    "usage": self.usage(now_ms).model_dump(mode="json"),
                },
            )
        return plan

    def check_resize(self, old: Resources, new: Resources, now_ms: int) -> None:
        """Raise ``insufficient_capacity`` when a machine's reservation cannot grow from ``old``
        to ``new`` here; shrinking always fits."""
        if (old.gpus, old.gpu_milli, old.gpu_model) != (new.gpus, new.gpu_milli, new.gpu_model):
            raise InvalidInput(
                "a machine's GPUs cannot change in place",
                hint="keep guest.gpus, gpu_milli and gpu_model as they are, or create a new "
                "machine with the GPUs it needs",
            )
        grow = old.growth_to(new)
        if grow == Resources.zero():
            return
        short = self.shortfall(grow, now_ms)
        if short is not None:
            raise InsufficientCapacity(
                f"the machine cannot grow on worker {self.worker_id}: {short.detail}",
                hint="update it to a size that fits, or create a new machine elsewhere",
                details={"reason": short.reason},
            )

    def check_regain(self, want: Resources, gpu_ids: tuple[int, ...], now_ms: int) -> None:
        """Raise ``insufficient_capacity`` when a machine that gave its reservation back (a
        failed one) cannot take it again for ``want`` here, on its GPUs ``gpu_ids``."""
        short = self.shortfall(want, now_ms)
        free = self.gpu_free(now_ms)
        if short is None and any(free[i] < gpus.per_gpu(want) for i in gpu_ids if i < len(free)):
            reason, detail = Reason.INSUFFICIENT_GPUS, "its GPUs are taken"
        elif short is not None:
            reason, detail = short.reason, short.detail
        else:
            return
        raise InsufficientCapacity(
            f"the machine cannot start again on worker {self.worker_id}: {detail} (a failed "
            "machine gives its reservation back)",
            hint="free capacity on its worker, or destroy it and create it again elsewhere",
            details={"reason": reason, "usage": self.usage(now_ms).model_dump(mode="json")},
        )

    def check_quote_app(self, quote: HeldQuote | None, quote_id: str, app: str) -> HeldQuote:
        if quote is None or quote.app != app:
            raise NotFound(
                f"quote {quote_id} not found in app {app}",
                hint="quotes belong to the app that asked for them",
            )
        return quote

    def check_batch(self, region: str, want: Resources, count: int, now_ms: int) -> None:
        """Raise the refusal for ``count`` new machines of ``want`` together, or return."""
        self._check_region(region)
        self._check_open()
        self._check_fits(want, now_ms, f"{count} machines together", count=count)

    def check_hold(self, region: str, want: Resources, now_ms: int) -> None:
        self._check_region(region)
        self._check_open()
        self._check_fits(want, now_ms, "the quote")

    def offer_refusal(self, want: Resources, now_ms: int) -> tuple[Reason, str] | None:
        """``(reason, detail)`` when an offer must say no; None when the worker can take it."""
        if self.cordoned:
            return Reason.CORDONED, f"worker {self.worker_id} is cordoned: it takes no new machines"
        short = self.shortfall(want, now_ms)
        return None if short is None else (short.reason, short.detail)

    def _check_region(self, region: str) -> None:
        if region != self.region:
            raise ClaimRefused(
                f"worker {self.worker_id} is in region {self.region}, not {region}",
                details={"reason": Reason.WRONG_REGION},
            )

    def _check_open(self) -> None:
        if self.cordoned:
            raise ClaimRefused(
                f"worker {self.worker_id} is cordoned",
                hint="it takes no new machines; try another worker",
                details={"reason": Reason.CORDONED},
            )

    def _check_fits(self, want: Resources, now_ms: int, what: str, *, count: int = 1) -> None:
        short = shortfall(
            want, self.capacity, self.in_use(now_ms), self.gpu_free(now_ms), count=count
        )
        if short is not None:
            raise ClaimRefused(
                f"{what} no longer fits: {short.detail}",
                hint="another claim took the capacity first; try another worker",
                details={
                    "reason": short.reason,
                    "usage": self.usage(now_ms).model_dump(mode="json"),
                },
            )

    # -- what was recorded -----------------------------------------------------------------

    def reserve(self, want: Resources, gpu_ids: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """A machine of ``want`` was recorded on GPUs ``gpu_ids`` (None: the ones
        :meth:`assign_gpus` picks now, counting every hold). Returns its GPUs."""
        if gpu_ids is None:
            gpu_ids = gpus.pick(want, self.gpu_free()) or () if want.wants_gpu else ()
        self.reserved = self.reserved.plus(want)
        self._gpu_free = gpus.take(want, self._gpu_free, gpu_ids)
        self._count_shape(want, 1)
        self.version += 1
        return gpu_ids

    def adopt_gpus(self, want: Resources, gpu_ids: tuple[int, ...]) -> None:
        """At a restart: a machine the store holds (its reservation already counted in
        ``reserved``) has ``gpu_ids``."""
        self._gpu_free = gpus.take(want, self._gpu_free, gpu_ids)
        self._count_shape(want, 1)

    def release(self, freed: Resources, gpu_ids: tuple[int, ...] = ()) -> None:
        self.reserved = self.reserved.minus(freed)
        self._gpu_free = gpus.give_back(freed, self._gpu_free, gpu_ids)
        self._count_shape(freed, -1)
        self.version += 1

    def _count_shape(self, want: Resources, n: int) -> None:
        shape = gpu_shape(want)
        if shape:
            self._gpu_shapes[shape] += n
            if self._gpu_shapes[shape] <= 0:
                del self._gpu_shapes[shape]

    def gpu_shapes(self) -> dict[str, int]:
        """Its GPU machines by shape (``WorkerInfo.gpu_shapes``)."""
        return dict(self._gpu_shapes)

    def hold(self, quote_id: str, want: Resources, expires_at: int) -> None:
        got = gpus.pick(want, self.gpu_free()) if want.wants_gpu else ()
        self._holds[quote_id] = _Hold(want, expires_at, got or ())
        self.version += 1

    def end_hold(self, quote_id: str) -> bool:
        """The hold ended (expired, released, or used by a claim, which reserves on its own);
        False when it was not live."""
        if self._holds.pop(quote_id, None) is None:
            return False
        self.version += 1
        return True

    def holds(self) -> list[str]:
        return list(self._holds)

    def set_flags(self, *, cordoned: bool, draining: bool) -> None:
        if (cordoned, draining) != (self.cordoned, self.draining):
            self.cordoned, self.draining = cordoned, draining
            self.version += 1


def _check_quote(quote: HeldQuote, want: Resources, now_ms: int) -> None:
    if quote.state is QuoteState.USED:
        raise QuoteUsed(
            f"quote {quote.id} was already used by machine {quote.machine_id}",
            hint="a quote makes one machine; ask for a new quote",
            details={"machine_id": quote.machine_id},
        )
    if quote.state is not QuoteState.HELD or quote.expires_at <= now_ms:
        raise QuoteExpired(
            f"quote {quote.id} was released"
            if quote.state is QuoteState.RELEASED
            else f"quote {quote.id} expired at {iso_from_ms(quote.expires_at)}",
            hint="ask for a new quote, or create the machine without one",
        )
    if not want.fits_within(quote.resources):
        raise InvalidInput(
            f"the machine asks for {want.cpus:g} cpus / {want.memory_mb} MiB but quote "
            f"{quote.id} holds {quote.resources.cpus:g} cpus / {quote.resources.memory_mb} MiB",
            hint="use the guest size the quote was made for",
        )
