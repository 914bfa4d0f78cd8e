"""The routing table: per app, the machines that can serve it, and how loaded each one is.

The control plane writes it (:meth:`RoutingTable.upsert`, :meth:`~RoutingTable.remove`,
:meth:`~RoutingTable.set_healthy`, :meth:`~RoutingTable.draining`); the relay reads it on every
request (:meth:`~RoutingTable.claim`, then :meth:`~RoutingTable.release` when the request or the
connection is over). Pure: no I/O, no clock; randomness comes from an injected generator.

**Balancing, Fly's way.** A machine can serve when it is ``started``, ``healthy``, not
draining and not cordoned (a cordoned machine is never woken for a request either). Among
those, :meth:`~RoutingTable.pick` takes, in this order:

1. machines below their soft limit before machines between soft and hard limit; a machine at
   its hard limit is never taken (``None``: the relay queues the request);
2. the nearest region first: the proxy's own, then the regions it was told are near, then the
   rest;
3. the least loaded;
4. among equals, one at random (reservoir sampling over the scan, so no list is built).

Why an exact scan and not power of two choices: two random choices shine when the load figures
are stale or a full scan is costly, and neither holds here. The counters are this process's own
and exact, and an app has a handful of machines, so the least loaded one is known at the cost of
one pass. The random tie-break still spreads requests when everything is idle, so that several
proxy processes (each with its own counters) do not herd onto the same machine.

**Load.** One counter per machine: the requests in flight to it, or the connections open to it
(a TCP pipe, an upgraded connection). For HTTP/1.1 the two coincide, since an upstream
connection carries one request at a time; a machine's ``kind`` says which figure its limits
were written for, as in Fly's ``concurrency.type``.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

__all__ = [
    "DEFAULT_HARD_LIMIT",
    "DEFAULT_SOFT_LIMIT",
    "PENDING_STATES",
    "WAKEABLE_STATES",
    "Availability",
    "Backend",
    "RoutingTable",
    "Slot",
]

DEFAULT_SOFT_LIMIT = 20
DEFAULT_HARD_LIMIT = 25
WAKEABLE_STATES = frozenset({"stopped", "suspended"})
"""States of a machine the control plane can start when a request needs it (``autostart``)."""
PENDING_STATES = frozenset({"created", "starting", "replacing", "updating"})
"""States of a machine on its way to ``started``: a request may wait for it."""

_TIER = 1 << 40  # soft-limit tier, then region rank, then load: one integer key per machine
_RANK = 1 << 20


@dataclass(frozen=True, slots=True)
class Backend:
    """One machine as the proxy sees it: where it listens and how much it may take."""

    machine_id: str
    app: str
    region: str
    host: str
    port: int
    worker_id: str = ""
    state: str = "started"
    healthy: bool = True
    kind: Literal["connections", "requests"] = "connections"
    soft_limit: int = DEFAULT_SOFT_LIMIT
    hard_limit: int = DEFAULT_HARD_LIMIT
    autostart: bool = True
    cordoned: bool = False  # out of rotation until uncordoned (it runs; it is never woken)

    def __post_init__(self) -> None:
        if self.hard_limit < 1 or self.soft_limit < 1:
            raise ValueError(f"machine {self.machine_id}: limits must be at least 1")
        if self.soft_limit > self.hard_limit:
            raise ValueError(
                f"machine {self.machine_id}: soft_limit {self.soft_limit} is above "
                f"hard_limit {self.hard_limit}"
            )


class Availability(enum.Enum):
    """What an app can do for a request that :meth:`RoutingTable.claim` could not place."""

    OPEN = "open"  # a machine can take it now
    FULL = "full"  # machines serve, every one at its hard limit: wait for one to free up
    WAKEABLE = "wakeable"  # nothing serves, a stopped machine can be started
    PENDING = "pending"  # nothing serves, a machine is on its way (or its checks fail): wait
    NONE = "none"  # the app has machines, none can serve
    UNKNOWN = "unknown"  # the table holds no machine of that app


class Slot:
    """The table's live record of one machine: its backend, its load, whether it drains.

    The relay holds the slot it claimed and gives it back to :meth:`RoutingTable.release`; a
    slot outlives its machine's removal, so a late release is harmless."""

    __slots__ = (
        "address",
        "backend",
        "draining",
        "hard",
        "listened",
        "load",
        "machine_id",
        "region",
        "serving",
        "soft",
    )

    def __init__(self, backend: Backend) -> None:
        self.load = 0
        self.draining = False
        # A connection to it was accepted since it (last) became what it is: a refusal then
        # means it stopped listening, not that it has yet to (the relay sets it).
        self.listened = False
        self.machine_id = backend.machine_id
        self._set(backend)

    def _set(self, backend: Backend) -> None:
        self.backend = backend
        self.address = (backend.host, backend.port)
        self.region = backend.region
        self.soft = backend.soft_limit
        self.hard = backend.hard_limit
        self.serving = (
            backend.state == "started"
            and backend.healthy
            and not self.draining
            and not backend.cordoned
        )

    def __repr__(self) -> str:
        return f"Slot({self.machine_id}, load={self.load}, draining={self.draining})"


class RoutingTable:
    """Per app, the machines that can serve, and their live load.

    ``nearby`` maps a region to the other regions nearest first; ``rng`` makes the tie-breaks
    reproducible. ``subscribe`` registers a callback called with the app's name after every
    change that may let a waiting request through (a machine added, healthy again, undrained,
    and also the ones that do not: removals, drains), never on a plain release."""

    def __init__(
        self,
        *,
        nearby: Mapping[str, Sequence[str]] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._apps: dict[str, list[Slot]] = {}
        self._slots: dict[str, Slot] = {}
        self._nearby = dict(nearby or {})
        self._ranks: dict[str | None, dict[str, int]] = {}
        self._random = (rng or random.Random()).random
        self._listeners: list[Callable[[str], None]] = []

    # -- what the control plane calls --------------------------------------------------------------

    def upsert(self, backend: Backend) -> None:
        """Add a machine, or replace what the table knows of it (its load and drain are kept;
        a change of state ends a drain)."""
        slot = self._slots.get(backend.machine_id)
        if slot is None:
            slot = Slot(backend)
            self._slots[backend.machine_id] = slot
            self._apps.setdefault(backend.app, []).append(slot)
        else:
            old = slot.backend
            if old.app != backend.app:
                self._unlink(slot)
                self._apps.setdefault(backend.app, []).append(slot)
            if old.state != backend.state:
                slot.draining = False
            if old.state != backend.state or (old.host, old.port) != (backend.host, backend.port):
                slot.listened = False  # started again, or elsewhere: not seen listening yet
            slot._set(backend)
        self._changed(backend.app)

    def remove(self, machine_id: str) -> Backend | None:
        """Forget a machine; returns what the table knew of it."""
        slot = self._slots.pop(machine_id, None)
        if slot is None:
            return None
        self._unlink(slot)
        self._changed(slot.backend.app)
        return slot.backend

    def set_healthy(self, machine_id: str, healthy: bool) -> None:
        slot = self._slots.get(machine_id)
        if slot is not None and slot.backend.healthy != healthy:
            slot._set(replace(slot.backend, healthy=healthy))
            self._changed(slot.backend.app)

    def draining(self, machine_id: str, draining: bool = True) -> int:
        """Take a machine out of rotation (before its stop signal is sent), or back in. Returns
        its load: the requests and connections still to finish."""
        slot = self._slots.get(machine_id)
        if slot is None:
            return 0
        if slot.draining != draining:
            slot.draining = draining
            slot._set(slot.backend)
            self._changed(slot.backend.app)
        return slot.load

    def subscribe(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    # -- what anybody reads ------------------------------------------------------------------------

    def apps(self) -> list[str]:
        return sorted(app for app, slots in self._apps.items() if slots)

    def backends(self, app: str) -> list[Backend]:
        return [slot.backend for slot in self._apps.get(app, ())]

    def get(self, machine_id: str) -> Backend | None:
        slot = self._slots.get(machine_id)
        return slot.backend if slot is not None else None

    def load(self, machine_id: str) -> int:
        slot = self._slots.get(machine_id)
        return slot.load if slot is not None else 0

    def is_draining(self, machine_id: str) -> bool:
        slot = self._slots.get(machine_id)
        return slot is not None and slot.draining

    # -- balancing ---------------------------------------------------------------------------------

    def pick(
        self,
        app: str,
        *,
        region: str | None = None,
        exclude: Collection[str] = (),
        only_region: str | None = None,
    ) -> Backend | None:
        """The machine the next request of ``app`` should go to, or None when none can take it
        (see the module's docstring). Counts nothing: :meth:`claim` picks and counts."""
        slot = self._best(app, region, exclude, only_region)
        return slot.backend if slot is not None else None

    def claim(
        self,
        app: str,
        region: str | None = None,
        exclude: Collection[str] = (),
        only_region: str | None = None,
    ) -> Slot | None:
        """:meth:`pick` and count one more request (or connection) on the machine picked."""
        slot = self._best(app, region, exclude, only_region)
        if slot is not None:
            slot.load += 1
        return slot

    def claim_machine(self, machine_id: str) -> Slot | None:
        """Count one more on this very machine, if it serves and is below its hard limit."""
        slot = self._slots.get(machine_id)
        if slot is None or not slot.serving or slot.load >= slot.hard:
            return None
        slot.load += 1
        return slot

    def release(self, slot: Slot) -> None:
        slot.load -= 1

    def availability(self, app: str) -> Availability:
        """Why :meth:`claim` found nothing (or :attr:`Availability.OPEN` if it would now)."""
        slots = self._apps.get(app)
        if not slots:
            return Availability.UNKNOWN
        full = wakeable = pending = False
        for slot in slots:
            if slot.serving:
                if slot.load < slot.hard:
                    return Availability.OPEN
                full = True
            elif slot.draining or slot.backend.cordoned:
                continue
            elif slot.backend.autostart and slot.backend.state in WAKEABLE_STATES:
                wakeable = True
            elif slot.backend.state in PENDING_STATES:
                pending = True
            elif slot.backend.state == "started":
                pending = True  # started, its checks failing for now: it may pass them soon
        if full:
            return Availability.FULL
        if wakeable:
            return Availability.WAKEABLE
        return Availability.PENDING if pending else Availability.NONE

    def wakeable(self, app: str) -> bool:
        """Whether the app has a machine that is not draining and may be started for it."""
        return any(
            not s.draining
            and not s.backend.cordoned
            and s.backend.autostart
            and s.backend.state in WAKEABLE_STATES
            for s in self._apps.get(app, ())
        )

    # -- inside ------------------------------------------------------------------------------------

    def _best(
        self,
        app: str,
        region: str | None,
        exclude: Collection[str],
        only_region: str | None,
    ) -> Slot | None:
        slots = self._apps.get(app)
        if not slots:
            return None
        if len(slots) == 1:  # one machine: nothing to balance
            slot = slots[0]
            if (
                slot.serving
                and slot.load < slot.hard
                and slot.machine_id not in exclude
                and (only_region is None or slot.region == only_region)
            ):
                return slot
            return None
        ranks = self._ranks.get(region)
        if ranks is None:
            ranks = self._rank_regions(region)
        far = len(ranks)
        best: Slot | None = None
        best_key = -1
        ties = 0
        for slot in slots:
            if not slot.serving:
                continue
            load = slot.load
            if load >= slot.hard:
                continue
            if exclude and slot.machine_id in exclude:
                continue
            if only_region is not None and slot.region != only_region:
                continue
            key = (load >= slot.soft) * _TIER + ranks.get(slot.region, far) * _RANK + load
            if best is None or key < best_key:
                best, best_key, ties = slot, key, 1
            elif key == best_key:
                ties += 1
                if self._random() * ties < 1.0:
                    best = slot
        return best

    def _rank_regions(self, region: str | None) -> dict[str, int]:
        order: Iterable[str] = () if region is None else (region, *self._nearby.get(region, ()))
        ranks: dict[str, int] = {}
        for r in order:
            ranks.setdefault(r, len(ranks))
        self._ranks[region] = ranks
        return ranks

    def _unlink(self, slot: Slot) -> None:
        siblings = self._apps.get(slot.backend.app)
        if siblings is not None:
            siblings.remove(slot)
            if not siblings:
                del self._apps[slot.backend.app]

    def _changed(self, app: str) -> None:
        for listener in self._listeners:
            listener(app)
