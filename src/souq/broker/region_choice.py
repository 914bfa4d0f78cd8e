"""A create that names no region: the region chosen for it (where the app has the fewest
machines, among those with room: :func:`souq.view.regions.default_region`), and, when that one
turns out full, the next region with room, and so on, each region's refusal said."""

from __future__ import annotations

import logging
from collections import Counter

from souq.broker.market import Market
from souq.broker.schemas import CreateMachineRequest
from souq.errors import InsufficientCapacity
from souq.model import ClaimRequest, Machine
from souq.view import summarise_regions
from souq.view.liveness import Liveness
from souq.view.regions import default_region, next_region

__all__ = ["place_somewhere", "with_region"]

log = logging.getLogger(__name__)


def with_region(
    liveness: Liveness, app: str, body: CreateMachineRequest
) -> tuple[CreateMachineRequest, str | None]:
    """``body`` with a region: its own, else :func:`souq.view.regions.default_region` (and
    why, for the placement record)."""
    if body.region is not None:
        return body, None
    workers, book = liveness.as_heard(), liveness.book
    held = Counter(w.region for w in workers for _ in range(book.app_machines(w.id, app)))
    chosen = default_region(held, summarise_regions(workers, body.config.guest.resources()))
    if chosen is None:
        raise InsufficientCapacity("no region has a worker up", hint="name a region")
    log.info("create in %s without a region: %s", app, chosen[1])
    return body.model_copy(update={"region": chosen[0]}), chosen[1]


async def place_somewhere(
    market: Market,
    liveness: Liveness,
    order: ClaimRequest,
    *,
    idempotent: bool,
    volume: tuple[str, str] | None,
    made_on: str | None = None,
) -> Machine:
    """Place ``order``; when its create named no region (and mounts no volume) and the region
    chosen for it had no room, in the next region with room, and so on: a create that may go
    anywhere is refused only when no region can take it. Each region's refusal is in the
    machine's ``region_chosen``, or in the last refusal's message."""
    tried: list[str] = []
    refusals: list[str] = []
    while True:
        try:
            return await market.place(order, idempotent=idempotent, volume=volume, made_on=made_on)
        except InsufficientCapacity as exc:
            if order.region_chosen is None or volume is not None:
                raise
            tried.append(order.region)
            refusals.append(f"{order.region}: {exc.message}")
            size = order.config.guest.resources()
            chosen = next_region(summarise_regions(liveness.as_heard(), size), tried)
            if chosen is None:
                if len(refusals) == 1:
                    raise
                raise InsufficientCapacity(
                    f"no region can take it: {'; '.join(refusals)}",
                    hint=exc.hint,
                    details=exc.details,
                ) from exc
            why = f"{order.region_chosen}; {order.region} had no room, so {chosen[1]}"
            log.info("create in %s without a region: %s", order.app, why)
            order = order.model_copy(update={"region": chosen[0], "region_chosen": why})
