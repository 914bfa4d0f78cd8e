"""A deploy's capacity: the quotes that hold all the room its plan needs, taken before any
change (a deploy that starts does not fail halfway for want of room), and placed so that one
lost worker is never a served group's region lost.

The room is of three kinds: a new machine's (a create's quote, used by the create); an update's
growth in place (a quote of what the new size takes more, on the machine's worker, let go just
before the update takes that room); and, where that growth does not fit, a replacement's (a
quote for a new machine of the new size elsewhere, which the deploy makes in the place of the
old one). The growth is held first (the machine is already on its worker), then the new
machines and the replacements together; if any of it cannot be had, every quote is let go and
the deploy fails before it changed anything.

The machines of a group with services in a region go to distinct workers while the region has
workers with room, whether ``[regions]`` names their number or Souq picks it, for the machines
``souq scale count`` adds and for the green set of a blue-green deploy: one group's quotes in a
region are taken one after another, each constrained away from the workers its siblings are on
(``worker.id not_in``: the machines that stay, and the quotes held before it); groups and
regions are held at once. A region that cannot spread says so, and its machine shares a worker.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from souq.apps.config import DEFAULT_GROUP, AppConfig
from souq.apps.plan import Phase, Step
from souq.client.api import SouqClient
from souq.errors import DeployNoCapacity, InsufficientCapacity, SouqError
from souq.model.machine import GuestConfig, Machine, MachineState
from souq.model.protocol import Quote
from souq.model.reasons import CLOSED
from souq.model.resources import Resources
from souq.model.worker import WorkerInfo, WorkerState

__all__ = ["GOING", "WORKERS", "Capacity", "attempt", "current_of", "why_not_spread"]

WORKERS = 16  # calls of one deploy made at once, at most
GOING = (MachineState.DESTROYING, MachineState.DESTROYED)
A = TypeVar("A")
R = TypeVar("R")
P = TypeVar("P")
Tell = Callable[[str, str, str | None], None]  # an event: kind, message, region
Key = tuple[int, int]  # a step: (phase, step)


def attempt(call: Callable[[A], R]) -> Callable[[A], R | SouqError]:
    """``call``, its error returned rather than raised (for a pool's map: every outcome kept)."""

    def attempted(arg: A) -> R | SouqError:
        try:
            return call(arg)
        except SouqError as exc:
            return exc

    return attempted


def current_of(machines: list[Machine], group: str, region: str) -> list[Machine]:
    """The machines of ``group`` in ``region`` (standbys and those on their way out left out)."""
    return [
        m
        for m in machines
        if m.region == region
        and m.config.metadata.get("souq_process_group", DEFAULT_GROUP) == group
        and not m.config.standbys
        and m.state not in GOING
    ]


def why_not_spread(workers: list[WorkerInfo], region: str, taken: set[str]) -> str:
    """Why a machine of a group found no worker of ``region`` outside ``taken`` (those that
    run its siblings): there is none that takes machines, or none of them has room."""
    others = [w for w in workers if w.region == region and w.state is WorkerState.UP]
    if all(w.id in taken for w in others):
        return f"every worker there ({len(others)}) already runs one of its machines"
    return "no other worker there has room"


def _not_on(workers: list[str]) -> dict[str, Any]:
    return {"attribute": "worker.id", "operator": "not_in", "value": workers}


def _closed(refusal: SouqError, worker_id: str) -> bool:
    """Whether a refused placement says ``worker_id`` takes no new machines."""
    placement = refusal.details.get("placement") or {}
    return any(
        o.get("worker_id") == worker_id and o.get("rejected") in CLOSED
        for o in placement.get("offers", ())
    )


def _on(worker: str) -> dict[str, Any]:
    return {"attribute": "worker.id", "operator": "=", "value": worker}


class Capacity:
    """The quotes of one deploy: :meth:`reserve` takes them; by step, :attr:`quotes` has the
    creates' (a create uses its own), :attr:`growth` the updates' growth in place (let go just
    before the update), :attr:`replacing` the replacements'; :meth:`release` lets go of those
    left."""

    def __init__(
        self, client: SouqClient, config: AppConfig, *, image: str, strategy: str, tell: Tell
    ) -> None:
        self.client = client
        self.config = config
        self.app = config.app
        self.image = image
        self.strategy = strategy
        self._tell = tell
        self.quotes: dict[Key, Quote] = {}  # a create's
        self.growth: dict[Key, Quote] = {}  # an update's growth in place, on its worker
        self.replacing: dict[Key, Quote] = {}  # an update's that cannot grow: a new machine's
        self._unspread: set[tuple[str, str]] = set()  # (group, region) said not to spread
        self._lock = threading.Lock()

    def reserve(self, version: int, phases: list[Phase], machines: list[Machine]) -> None:
        """Hold all the room the plan of release ``version`` needs, as the module says;
        :class:`DeployNoCapacity` (every quote let go) when some of it cannot be had.
        ``machines``: the app's, as the deploy found them."""
        replacing = self._hold_growth(phases, machines)
        wanted: dict[tuple[str, str], list[tuple[Key, Step]]] = {}
        for i, phase in enumerate(phases):
            for j, step in enumerate(phase.steps):
                if step.action == "create" or (i, j) in replacing:
                    wanted.setdefault((step.group, step.region), []).append(((i, j), step))
        staying = [] if self.strategy == "bluegreen" else machines  # blue goes: green spreads

        def hold_group(
            items: list[tuple[Key, Step]],
        ) -> list[tuple[Key, Quote | SouqError]]:
            group, region = items[0][1].group, items[0][1].region
            taken = None
            if self.config.served(group):
                taken = {m.worker_id for m in current_of(staying, group, region)}
            hold = attempt(functools.partial(self._hold, taken=taken))
            return [(key, hold(step)) for key, step in items]

        outcomes: dict[Key, Quote | SouqError] = {}
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            for held in pool.map(hold_group, wanted.values()):
                outcomes.update(held)
        for key, quote in outcomes.items():
            if isinstance(quote, Quote):
                (self.replacing if key in replacing else self.quotes)[key] = quote
        for items in wanted.values():
            for key, step in items:
                quote = outcomes[key]
                if isinstance(quote, SouqError):
                    self.release()
                    raise self._no_room(version, step, quote, replacing=key in replacing)
        made = len(outcomes) - len(replacing)
        told = [
            f"{made} new machines" if made else "",
            f"{len(self.growth)} machines' growth in place" if self.growth else "",
            f"{len(replacing)} replacements (no room to grow in place)" if replacing else "",
        ]
        if any(told):
            self._tell("reserve", "capacity held for " + ", ".join(t for t in told if t), None)

    def _hold_growth(self, phases: list[Phase], machines: list[Machine]) -> set[Key]:
        """Hold each update's growth on its machine's worker (at once); the updates whose
        worker has not the room (to be replaced by a new machine elsewhere)."""
        by_id = {m.id: m for m in machines}
        updates = [
            ((i, j), step, by_id[step.machine_id])
            for i, phase in enumerate(phases)
            for j, step in enumerate(phase.steps)
            if step.action == "update" and step.machine_id in by_id
        ]

        def grow(item: tuple[Key, Step, Machine]) -> Quote | bool | None:
            return self._grow(item[1], item[2])

        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            grown = list(zip(updates, pool.map(attempt(grow), updates), strict=True))
        self.growth.update({u[0]: q for u, q in grown if isinstance(q, Quote)})
        failed = next((q for _, q in grown if isinstance(q, SouqError)), None)
        if failed is not None:  # not a want of room (that is False): let go, and say it
            self.release()
            raise failed
        return {u[0] for u, q in grown if q is False}

    def _grow(self, step: Step, machine: Machine) -> Quote | bool | None:
        """A quote of what ``step``'s new size takes more than ``machine``'s, on its worker;
        None when it takes no more, False when its worker has not that room."""
        config = self.config.machine_config(step.group, image=self.image, release=0)
        old = machine.config.guest.resources()
        grow = old.growth_to(GuestConfig.model_validate(config.get("guest", {})).resources())
        if grow == Resources.zero():
            return None
        # A quote asks for a machine's size, never nothing of CPU or memory: the least of each.
        guest = {
            "cpus": max(grow.cpus, 0.001),
            "memory_mb": max(grow.memory_mb, 1),
            "disk_mb": grow.disk_mb,
        }
        body = {
            "image": config["image"],
            "cmd": config["cmd"],
            "guest": guest,
            "constraints": [_on(machine.worker_id)],
        }
        try:
            return self.client.create_quote(self.app, step.region, body, ttl_s=3600)
        except InsufficientCapacity as exc:
            # A worker that takes no new machine (cordoned, draining) holds no quote, but its
            # machines still grow in place where it has the room: unheld, as an update does.
            return None if _closed(exc, machine.worker_id) else False

    def _no_room(
        self, version: int, step: Step, error: SouqError, *, replacing: bool
    ) -> DeployNoCapacity:
        placement = error.details.get("placement")
        what = (
            f"machine {step.machine_id} cannot grow on its worker, and there is no room for a "
            f"new {step.group} machine in {step.region} to replace it"
            if replacing
            else f"no room for a new {step.group} machine in {step.region}"
        )
        return DeployNoCapacity(
            f"release v{version} cannot start: {what}: {error.message}; nothing was changed",
            hint="add workers or capacity in that region, or deploy smaller machines",
            details={
                "phase": "reserve",
                "region": step.region,
                **({"machine_id": step.machine_id} if step.machine_id else {}),
                **({"placement": placement} if placement else {}),
            },
        )

    def let_go(self, quote: Quote) -> None:
        """Let go of one quote now (its room is the caller's next call's)."""
        with contextlib.suppress(SouqError):  # expired meanwhile
            self.client.release_quote(self.app, quote.id)

    def _hold(self, step: Step, taken: set[str] | None) -> Quote:
        """A quote for ``step``'s machine; with ``taken`` (a served group's workers in the
        region so far), on another worker if one has room, else on one of them (said)."""
        config = self.config.machine_config(step.group, image=self.image, release=0)

        def quote(body: dict[str, Any]) -> Quote:
            return self.client.create_quote(self.app, step.region, body, ttl_s=3600)

        held = self.away(quote, config, taken or set(), step)
        if taken is not None:
            taken.add(held.worker_id)
        return held

    def away(
        self,
        place: Callable[[dict[str, Any]], P],
        config: dict[str, Any],
        taken: set[str],
        step: Step,
    ) -> P:
        """``place(config)`` on a worker not in ``taken`` if one has room, else anywhere, and
        then the deploy says that ``step``'s region cannot spread its group."""
        if not taken:
            return place(config)
        try:
            return place({**config, "constraints": [_not_on(sorted(taken))]})
        except InsufficientCapacity:
            with self._lock:
                said = (step.group, step.region) in self._unspread
                self._unspread.add((step.group, step.region))
            if not said:  # once a group and region, however many machines it places
                why = why_not_spread(self.client.workers(), step.region, taken)
                self._tell(
                    "reserve",
                    f"{step.region} cannot spread {step.group}: {why}, "
                    f"so a new {step.group} machine shares a worker with another "
                    "(losing that worker loses both)",
                    step.region,
                )
        return place(config)

    def release(self) -> None:
        """Let go of every quote still held (those used by their machine are gone already)."""
        quotes = [*self.quotes.values(), *self.growth.values(), *self.replacing.values()]
        self.quotes, self.growth, self.replacing = {}, {}, {}
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            list(pool.map(self.let_go, quotes))
