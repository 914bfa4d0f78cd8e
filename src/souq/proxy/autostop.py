"""Autostop: which idle machines the proxy stops (or suspends). Pure: loads in, decisions out.

Fly's rule, per app and region, on every round (``--autostop-interval``):

* with several machines running, count those over their soft limit; when the running machines
  exceed them by more than one, one machine is more than the load needs: stop one (the least
  loaded, idle first);
* a lone running machine stops when it has no load at all;
* never below the service's ``min_machines_running``, and only machines whose service says
  ``autostop`` (``stop`` or ``suspend``, which is what is done to them);
* never a machine still *settling*: it proved itself (its checks all passed since it started)
  a moment ago (two of its check intervals). It counts as running, but it is not idle yet: a
  deploy that made or updated it may be about to see it healthy (:mod:`souq.proxy.idle` leaves
  out altogether a machine whose checks have not passed yet: it cannot serve, and a deploy
  waits on it); nor one whose stop was refused for a lease that still lasts (a deploy's).

One machine per app and region per round: the next round sees the load without it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Idle", "Running", "choose"]

Action = Literal["stop", "suspend"]


@dataclass(frozen=True)
class Running:
    """A started machine as the proxy sees it now."""

    machine_id: str
    app: str
    region: str
    load: int  # its connections or requests in flight (the service's concurrency type)
    soft_limit: int
    autostop: Literal["off", "stop", "suspend"]
    min_running: int  # the service's min_machines_running
    settling: bool = False  # proved itself a moment ago: never chosen
    leased: bool = False  # its stop was refused for a lease that still lasts: never chosen


@dataclass(frozen=True)
class Idle:
    """A decision: do ``action`` to ``machine_id``, and why (for the record)."""

    machine_id: str
    app: str
    region: str
    action: Action
    reason: str


def choose(machines: Iterable[Running]) -> list[Idle]:
    """The machines to stop or suspend this round: at most one per app and region."""
    groups: dict[tuple[str, str], list[Running]] = defaultdict(list)
    for m in machines:
        groups[m.app, m.region].append(m)
    decisions = []
    for (app, region), group in sorted(groups.items()):
        decision = _one(app, region, group)
        if decision is not None:
            decisions.append(decision)
    return decisions


def _one(app: str, region: str, group: list[Running]) -> Idle | None:
    running = len(group)
    floor = max(m.min_running for m in group)
    if running <= floor:
        return None
    candidates = sorted(
        (m for m in group if m.autostop != "off" and not m.settling and not m.leased),
        key=lambda m: (m.load, m.machine_id),
    )
    if not candidates:
        return None
    victim = candidates[0]
    if running == 1:
        if victim.load > 0:
            return None
        reason = "the app's only machine in the region has had no load"
    else:
        over_soft = sum(1 for m in group if m.load > m.soft_limit)
        if running - over_soft <= 1:
            return None
        reason = (
            f"{running} machines running, {over_soft} over their soft limit: "
            "one more than the load needs"
        )
    assert victim.autostop != "off"
    return Idle(victim.machine_id, app, region, victim.autostop, reason)
