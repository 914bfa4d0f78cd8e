"""A deploy's capacity: the quotes that hold the room of every machine its plan makes, taken
before any change (a deploy that starts does not fail halfway for want of room), and placed so
that one lost worker is never a served group's region lost.

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from souq.apps.config import DEFAULT_GROUP, AppConfig
from souq.apps.plan import Phase, Step
from souq.client.api import SouqClient
from souq.errors import DeployNoCapacity, InsufficientCapacity, SouqError
from souq.model.machine import Machine, MachineState
from souq.model.protocol import Quote
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


class Capacity:
    """The quotes of one deploy: :meth:`reserve` takes them, :attr:`quotes` has them by step
    (a create uses its own), :meth:`release` lets go of those left."""

    def __init__(
        self, client: SouqClient, config: AppConfig, *, image: str, strategy: str, tell: Tell
    ) -> None:
        self.client = client
        self.config = config
        self.app = config.app
        self.image = image
        self.strategy = strategy
        self._tell = tell
        self.quotes: dict[Key, Quote] = {}

    def reserve(self, version: int, phases: list[Phase], machines: list[Machine]) -> None:
        """Hold the capacity of every machine the plan of release ``version`` makes, spread as
        the module says; :class:`DeployNoCapacity` (every quote let go) when one finds no room.
        ``machines``: the app's, as the deploy found them."""
        wanted: dict[tuple[str, str], list[tuple[Key, Step]]] = {}
        for i, phase in enumerate(phases):
            for j, step in enumerate(phase.steps):
                if step.action == "create":
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
        self.quotes.update({k: q for k, q in outcomes.items() if isinstance(q, Quote)})
        for items in wanted.values():
            for key, step in items:
                quote = outcomes[key]
                if isinstance(quote, SouqError):
                    self.release()
                    placement = quote.details.get("placement")
                    raise DeployNoCapacity(
                        f"release v{version} cannot start: no room for a new {step.group} "
                        f"machine in {step.region}: {quote.message}; nothing was changed",
                        hint="add workers or capacity in that region, or deploy smaller machines",
                        details={
                            "phase": "reserve",
                            "region": step.region,
                            **({"placement": placement} if placement else {}),
                        },
                    ) from quote
        if outcomes:
            self._tell("reserve", f"capacity held for {len(outcomes)} new machines", None)

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
        def let_go(quote: Quote) -> None:
            with contextlib.suppress(SouqError):  # used by its machine, or expired
                self.client.release_quote(self.app, quote.id)

        quotes, self.quotes = list(self.quotes.values()), {}
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            list(pool.map(let_go, quotes))
