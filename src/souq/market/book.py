"""The broker's book of workers: what each has promised, kept fresh by what they say.

Pure. A broker learns every worker's capacity and allocation from its heartbeats, its usage
messages (sent after every claim or destroy, :class:`~souq.model.WorkerUsage`) and the
refusals of its claims, each stamped with the worker's ledger version: the highest version heard
wins, and an older one never overwrites it. Between two of them the book charges the claims
this broker made itself, so that it does not send the next create to a worker it just filled.

With the book a create does not ask every worker for an offer: :meth:`WorkerBook.candidates`
draws workers of the region at random (seeded from the request id, so every broker that knows
the same workers draws the same ones) and offers them to the placement pipeline as the book
sees them, until enough have room (power of d choices, as Sparrow and Nomad do). Its cost does
not grow with the region. The worker's claim stays the judge: a stale book costs a refused
claim, which carries the worker's usage and corrects the book at once.

The book also counts each app's machines per worker, from the machine events every broker
receives (and its own placements): anti-affinity and ``distinct_workers_for`` need them. And it
knows what each worker's image cache holds (its images and the short digests of its layers, as
its heartbeats say): an offer says how much of the wanted image the worker would pull, and the
draw for an image starts with workers that hold it, so that cache locality is never missed for
want of drawing them.

A create that fits nowhere but may displace machines of a lower class draws the same way, with
each worker seen as it would stand once those classes gave their room back (``displace``):
every heartbeat and usage message says what each class could free there
(:class:`~souq.model.worker.PreemptibleRoom`). Such an offer carries an *estimated* eviction
(the lowest class that must give, a guess at how many machines, the cheapest bid among them);
the worker's claim chooses the victims on its own ledger, and refuses (``no_preemptible``) when
the book was wrong.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from souq.market.preemption import RANK
from souq.model.protocol import Offer, OfferedEviction
from souq.model.reasons import Reason
from souq.model.resources import Resources
from souq.model.worker import Load, PreemptibleRoom, WorkerInfo, WorkerState, WorkerUsage
from souq.placement import gpus
from souq.placement.request import WantedImage
from souq.placement.stages import shortfall

__all__ = ["Candidates", "WorkerBook"]

_DRAW_ROUND = 16  # a region this small (x4) is shuffled whole to draw from


@dataclass
class _Entry:
    info: WorkerInfo  # the worker's facts as last heard (labels, fingerprint, capacity)
    allocated: Resources  # the best estimate: the newest word, plus this broker's claims since
    version: int  # the ledger version of the newest word
    state: WorkerState
    base: Resources = field(default_factory=Resources.zero)  # allocation as of ``version``
    # This broker's accepted claims the newest word may not include yet: (the worker's ledger
    # version once the claim was made, one machine's size, how many). A word of that version or
    # newer has it.
    pending: list[tuple[int, Resources, int]] = field(default_factory=list)
    gpu_base: tuple[int, ...] = ()  # free thousandths per GPU as of ``version``
    gpu_free: tuple[int, ...] = ()  # the same with this broker's claims since (by gpus.pick)
    load: Load | None = None
    layers: frozenset[str] = frozenset()  # short digests of the image layers it holds
    shown: WorkerInfo | None = None  # ``info`` with ``allocated`` and ``state`` as they are now
    # What each lower class could free, lowest first, as of ``version`` (None: never said).
    preemptible: list[PreemptibleRoom] | None = None

    def as_now(self) -> WorkerInfo:
        """The worker as the book sees it now (built again only after it changed)."""
        shown = self.shown
        if shown is None or shown.allocated is not self.allocated or shown.state != self.state:
            update: dict[str, object] = {"allocated": self.allocated, "state": self.state}
            if self.gpu_free:
                update["gpu_free"] = list(self.gpu_free)
            shown = self.shown = self.info.model_copy(update=update)
        return shown


@dataclass(frozen=True)
class Candidates:
    """What the book proposes for a placement: offers as the book sees them (full or cordoned
    workers among them, for the explanation), and how many workers it drew from."""

    offers: list[Offer]
    feasible: int
    population: int  # workers of the region the book knows


class WorkerBook:
    def __init__(self) -> None:
        self._workers: dict[str, _Entry] = {}
        self._regions: dict[str, list[str]] = {}  # region -> worker ids, in arrival order
        self._machines: dict[str, tuple[str, str]] = {}  # machine id -> (worker id, app)
        self._apps: Counter[tuple[str, str]] = Counter()  # (worker id, app) -> live machines
        self._holders: dict[str, set[str]] = {}  # image reference -> workers caching it

    def __len__(self) -> int:
        return len(self._workers)

    def knows(self, region: str) -> bool:
        return bool(self._regions.get(region))

    def population(self, region: str) -> int:
        return len(self._regions.get(region, ()))

    # -- what workers say ------------------------------------------------------------------

    def observe(self, info: WorkerInfo, *, layers: Sequence[str] | None = None) -> None:
        """A heartbeat: the worker's facts (its cached images among them), its layers' short
        digests, and its allocation if no newer one was heard."""
        entry = self._workers.get(info.id)
        before = () if entry is None else entry.info.images
        if before != info.images:
            self._index_images(info.id, before, info.images)
        if entry is None:
            entry = _Entry(info, info.allocated, info.version, info.state, base=info.allocated)
            self._workers[info.id] = entry
            self._regions.setdefault(info.region, []).append(info.id)
        elif entry.info.region != info.region:
            self._regions[entry.info.region].remove(info.id)
            self._regions.setdefault(info.region, []).append(info.id)
        entry.info = info
        entry.shown = None
        entry.load = info.load
        if layers is not None:
            entry.layers = frozenset(layers)
        self._take(
            entry,
            info.allocated,
            info.version,
            info.state,
            info.gpu_free,
            preemptible=info.preemptible,
        )

    def _index_images(self, worker_id: str, before: Sequence[str], now: Sequence[str]) -> None:
        for ref in set(before) - set(now):
            holders = self._holders.get(ref)
            if holders is not None:
                holders.discard(worker_id)
                if not holders:
                    del self._holders[ref]
        for ref in now:
            self._holders.setdefault(ref, set()).add(worker_id)

    def holders(self, reference: str) -> list[str]:
        """The workers whose heartbeats say they cache the image, in a stable order."""
        return sorted(self._holders.get(reference, ()))

    def observe_usage(self, usage: WorkerUsage) -> None:
        entry = self._workers.get(usage.worker_id)
        if entry is not None:
            self._take(
                entry,
                usage.allocated,
                usage.version,
                usage.state,
                usage.gpu_free,
                preemptible=usage.preemptible,
            )

    @staticmethod
    def _take(
        entry: _Entry,
        allocated: Resources,
        version: int,
        state: WorkerState,
        gpu_free: Sequence[int],
        *,
        preemptible: list[PreemptibleRoom] | None,
    ) -> None:
        # Version 0 is a peer that does not number its ledger: its newest word counts. A word
        # that does not say what lower classes could free (a refusal's) leaves that as it was.
        if version == 0 or version >= entry.version:
            entry.base, entry.version, entry.state = allocated, version, state
            if preemptible is not None:
                entry.preemptible = preemptible
            entry.gpu_base = gpus.free_of(entry.info.capacity, allocated, gpu_free)
            entry.pending = [p for p in entry.pending if p[0] > version]
            _estimate(entry)

    def charge(
        self, worker_id: str, want: Resources, *, count: int = 1, version: int | None = None
    ) -> None:
        """This broker's claim was accepted: count it until the worker's word of ``version``
        (its ledger version once the claim was made) or newer; with no version, until its next
        word."""
        entry = self._workers.get(worker_id)
        if entry is None or (version is not None and version <= entry.version):
            return  # the newest word already has it
        entry.pending.append((version or 0, want, count))
        _estimate(entry)

    def placed(self, machine_id: str, worker_id: str, app: str) -> None:
        """A machine of ``app`` lives on ``worker_id`` (a placement, or an event)."""
        if machine_id not in self._machines:
            self._machines[machine_id] = (worker_id, app)
            self._apps[worker_id, app] += 1

    def gone(self, machine_id: str) -> None:
        """A machine was destroyed."""
        where = self._machines.pop(machine_id, None)
        if where is not None:
            self._apps[where] -= 1
            if self._apps[where] <= 0:
                del self._apps[where]

    def worker_of(self, machine_id: str) -> str | None:
        """The worker a machine lives on, as the book heard it (placements and events)."""
        where = self._machines.get(machine_id)
        return None if where is None else where[0]

    def app_of(self, machine_id: str) -> str | None:
        """The app a machine belongs to, as the book heard it (placements and events)."""
        where = self._machines.get(machine_id)
        return None if where is None else where[1]

    def _region_of(self, worker_id: str) -> str | None:
        entry = self._workers.get(worker_id)
        return None if entry is None else entry.info.region

    def app_machines(self, worker_id: str, app: str) -> int:
        return self._apps.get((worker_id, app), 0)

    def allocated(self, worker_id: str) -> Resources | None:
        entry = self._workers.get(worker_id)
        return None if entry is None else entry.allocated

    # -- candidates ------------------------------------------------------------------------

    def offer(
        self,
        worker_id: str,
        app: str,
        want: Resources,
        image: WantedImage | None = None,
        displace: tuple[str, ...] = (),
    ) -> Offer | None:
        """The worker's offer for a machine of ``want`` (running ``image``), as the book sees
        it; ``displace``: the classes it may displace, when it does not fit as it is."""
        e = self._workers.get(worker_id)
        if e is None:
            return None
        worker = e.as_now()
        reason = detail = None
        eviction = None
        if e.state in (WorkerState.CORDONED, WorkerState.DRAINING):
            reason, detail = Reason.CORDONED, f"worker {worker_id} takes no new machines"
        else:
            short = shortfall(want, e.info.capacity, e.allocated, e.gpu_free)
            if short is not None and displace:
                eviction = _could_free(e, want, displace)
            if short is not None and eviction is None:
                reason, detail = short.reason, short.detail
        held = pull = None
        if image is not None:
            held, pull = image.missing(e.layers, cached=image.reference in worker.images)
        return Offer(
            worker=worker,
            eligible=reason is None,
            reason=reason,
            detail=detail,
            load=e.load,
            image_layers=held,
            image_bytes=pull,
            app_machines=self.app_machines(worker_id, app),
            eviction=eviction,
        )

    def candidates(
        self,
        region: str,
        app: str,
        want: Resources,
        *,
        seed: str,
        wanted: int,
        slots: int = 1,
        exclude: set[str] | frozenset[str] = frozenset(),
        alive: Callable[[str], bool] = lambda _: True,
        max_draw: int = 256,
        image: WantedImage | None = None,
        pinned: str | None = None,
        displace: tuple[str, ...] = (),
    ) -> Candidates:
        """Draw workers of ``region`` at random (seeded) until ``wanted`` of them have room for
        ``want`` and, together, for ``slots`` machines of it; at most ``max_draw`` workers.
        Workers in ``exclude`` (asked already) and those ``alive`` says are gone are skipped.
        For an ``image``, up to ``wanted`` workers that cache it are drawn first; ``pinned``
        (the worker holding a volume the machine mounts) before them. ``displace``: the classes
        the machine may displace; a worker with room once they gave theirs back has room."""
        ids = self._regions.get(region, [])
        rng = random.Random(seed)
        offers: list[Offer] = []
        feasible = room = 0
        first: list[str] = []
        if image is not None and (holders := self._holders.get(image.reference)):
            first = [
                w
                for w in sorted(holders)
                if self._region_of(w) == region and w not in exclude and alive(w)
            ]
            rng.shuffle(first)
            first = first[:wanted]
        if pinned is not None and pinned not in exclude and self._region_of(pinned) == region:
            first = [pinned, *first]
        # Indexes, not a generator expression of ids: compiled, a generator expression is
        # evaluated whole before the loop sees it, and this one draws up to 2 x max_draw.
        drawn = _draw(len(ids), rng, max_draw * 2)
        for worker_id in _chain_unique(first, ids, drawn):
            if worker_id in exclude or not alive(worker_id):
                continue
            offer = self.offer(worker_id, app, want, image, displace)
            if offer is None:
                continue
            offers.append(offer)
            if offer.eligible:
                feasible += 1
                # One machine needs no count of how many fit: room for it is what eligible says.
                w = offer.worker
                room += 1 if slots == 1 else _fits(want, w.capacity, w.allocated, w.gpu_free)
            if len(offers) >= max_draw or (feasible >= wanted and room >= slots):
                break
        return Candidates(offers=offers, feasible=feasible, population=len(ids))


def _could_free(
    entry: _Entry, want: Resources, displace: tuple[str, ...]
) -> OfferedEviction | None:
    """The eviction the book estimates would make room for ``want`` on ``entry``'s worker:
    the classes in ``displace`` give their room back, the lowest first, until it fits; None
    when all of them would not do (or the worker never said, or it wants GPUs, which the
    book does not follow machine by machine)."""
    rooms = entry.preemptible
    if not rooms or want.wants_gpu:
        return None
    capacity, allocated = entry.info.capacity, entry.allocated
    freed = Resources.zero()
    lower = 0  # machines of the classes below, all of them displaced
    for room in sorted(rooms, key=lambda r: RANK.get(r.priority_class, len(RANK))):
        if room.priority_class not in displace or room.machines <= 0:
            continue
        left = allocated.minus(freed)
        freed = freed.plus(room.resources)
        if shortfall(want, capacity, allocated.minus(freed), ()) is not None:
            lower += room.machines
            continue
        # How many machines of the class's average size the missing room takes, at least one.
        victims = lower + min(room.machines, _share(want, capacity, left, room))
        unbounded = victims if room.cheapest is None else 0
        return OfferedEviction(
            victims=victims,
            freed=freed,
            top_class=RANK[room.priority_class],
            unbounded=unbounded,
            priced=room.cheapest or 0.0,
            running=victims,
            estimated=True,
        )
    return None


def _share(
    want: Resources, capacity: Resources, allocated: Resources, room: PreemptibleRoom
) -> int:
    """How many of ``room``'s machines (of their average size) give back what ``want`` lacks."""
    most = 1
    for need, total, used, held in (
        (want.millicpus, capacity.millicpus, allocated.millicpus, room.resources.millicpus),
        (want.memory_mb, capacity.memory_mb, allocated.memory_mb, room.resources.memory_mb),
        (want.disk_mb, capacity.disk_mb, allocated.disk_mb, room.resources.disk_mb),
    ):
        lack = need - max(0, total - used)
        if lack > 0 and held > 0:
            most = max(most, -(-lack * room.machines // held))
    return most


def _chain_unique(first: list[str], ids: list[str], then: Iterator[int]) -> Iterator[str]:
    yield from first
    for i in then:
        if (worker_id := ids[i]) not in first:
            yield worker_id


def _estimate(entry: _Entry) -> None:
    allocated, free = entry.base, entry.gpu_base
    for _, want, count in entry.pending:
        allocated = allocated.plus(want if count == 1 else want.times(count))
        if want.wants_gpu:
            for got in gpus.pick_many(want, free, count) or ():
                free = gpus.take(want, free, got)
    entry.allocated, entry.gpu_free = allocated, free


def _draw(n: int, rng: random.Random, limit: int) -> Iterator[int]:
    """Distinct indexes in ``range(n)`` in a random order, at most ``limit`` of them, at a cost
    that grows with how many are taken, not with ``n`` (a small ``n`` is shuffled whole)."""
    if n <= 4 * _DRAW_ROUND or n <= limit:
        order = list(range(n))
        rng.shuffle(order)
        yield from order[:limit]
        return
    seen: set[int] = set()
    while len(seen) < min(n, limit):
        i = rng.randrange(n)
        if i not in seen:
            seen.add(i)
            yield i


def _fits(
    want: Resources, capacity: Resources, allocated: Resources, gpu_free: Sequence[int]
) -> int:
    """How many machines of ``want`` fit in what ``capacity`` leaves after ``allocated`` (and,
    GPU by GPU, in ``gpu_free``)."""
    counts = []
    for need, total, used in (
        (want.millicpus, capacity.millicpus, allocated.millicpus),
        (want.memory_mb, capacity.memory_mb, allocated.memory_mb),
        (want.disk_mb, capacity.disk_mb, allocated.disk_mb),
    ):
        if need > 0:
            counts.append(max(0, (total - used) // need))
    most = min(counts) if counts else 1_000_000
    if want.wants_gpu:
        most = gpus.fits_count(want, gpus.free_of(capacity, allocated, gpu_free), most)
    return most
