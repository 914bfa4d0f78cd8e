"""A deploy's plan: from the app's machines as they are and its config as it should be, the
phases that get there under a strategy. Pure: the deploy (:mod:`souq.client.deploy`) carries
it out through the API and rolls back what it did when a phase fails.

Every process group has its machines per region (``[regions]``; else the primary region: two
machines for a group with services, so that one lost worker is not the app lost, one for a group
without). Existing machines of the group in the region are updated in place (up to the count),
missing ones created, extra ones destroyed, each in the phases of the strategy:

* ``immediate`` — every update and create at once, no wait for health; then the extras go;
* ``rolling`` — region by region (the primary first), group by group, at most
  ``max_unavailable`` machines at a time, each batch healthy before the next; the machines at
  rest (stopped, suspended: the proxy's autostop, or a user) first, the started ones last, so
  that a release that fails its checks fails on a machine that was serving nothing while the
  started ones go on serving the old one; new machines after, healthy too; then the extras go;
* ``canary`` — one new machine of the first group in the primary region first, healthy, then
  destroyed; then as ``rolling``;
* ``bluegreen`` — a whole new set (green) beside the old (blue), every green machine healthy;
  then every blue machine goes: the proxy routes to the green ones as they pass their checks,
  and to no blue one once they stop.

A group without services (a singleton, a cron-like job) has, besides each machine, a standby:
a stopped machine on another worker that the proxy starts if the first one's worker is lost.
Existing standbys are updated (they stay stopped) after the other phases; the standbys of
machines that go, go too; :func:`standbys_wanted` says which machines still lack one once the
phases are done (the deploy makes them then: a new machine's id is known only once it is made).

A machine of a group with services that a create of a higher priority class displaced (an
event ``preempted`` newer than its last start: ``Current.preempted`` holds its message) is not
counted as one of its group's: a new machine is created in its place, kept off the workers of
its group's machines as any new one is (the displaced one's among them), and the displaced one
goes with the cleanup, once the new one is healthy; both steps say why (``Step.why``). So a
deploy, a scale, or ``souq scale reconcile`` (a scale to the counts the app has) re-places the
machines preemption took, as Nomad reschedules a preempted allocation. (A group without
services has its standby started by the proxy instead.)

A scale (``souq scale count``, :func:`scale`) is not a deploy of a new config: in the regions it
names only, each group's missing machines are created and its extras destroyed (the stopped
ones first, with their standbys); no machine that stays is updated or restarted, and a scale to
the count the app has changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from souq.apps.config import AppConfig

__all__ = ["Current", "Phase", "Step", "desired_counts", "plan", "scale", "standbys_wanted"]

Action = Literal["update", "create", "destroy"]


@dataclass(frozen=True)
class Current:
    """A machine of the app as the deploy found it."""

    id: str
    group: str
    region: str
    state: str
    release: int | None = None
    standby_for: tuple[str, ...] = ()  # a standby: the machines it stands by for
    preempted: str = ""  # displaced by a higher class since its last start: the event's message


@dataclass(frozen=True)
class Step:
    action: Action
    group: str
    region: str
    machine_id: str | None = None  # update and destroy: the machine
    canary: bool = False  # a canary: destroyed once it proved healthy
    standby_for: tuple[str, ...] = ()  # a standby's update: it stays stopped
    why: str = ""  # what the step is for, when the plan has more to say than its action


@dataclass(frozen=True)
class Phase:
    name: str
    steps: tuple[Step, ...]
    wait_healthy: bool = True
    region: str | None = None

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for step in self.steps:
            counts[step.action] = counts.get(step.action, 0) + 1
        return ", ".join(f"{n} to {a}" for a, n in counts.items()) or "nothing"


@dataclass
class _Group:
    group: str
    region: str
    want: int
    have: list[Current] = field(default_factory=list)
    displaced: list[Current] = field(default_factory=list)  # preempted: replaced, then gone

    @property
    def keep(self) -> list[Current]:
        return self.have[: self.want]

    @property
    def extra(self) -> list[Current]:
        return self.have[self.want :]

    @property
    def missing(self) -> int:
        return max(0, self.want - len(self.have))

    def creates(self, region: str) -> list[Step]:
        """The machines it lacks; the first in the place of its displaced ones."""
        places = [m.id for m in self.displaced]
        return [
            Step(
                "create",
                self.group,
                region,
                why=f"in the place of machine {places[k]}, preempted" if k < len(places) else "",
            )
            for k in range(self.missing)
        ]

    def gone(self) -> list[Step]:
        """Its displaced machines go (once their replacements are up)."""
        return [
            Step("destroy", self.group, self.region, m.id, why=f"replaced: {m.preempted}")
            for m in self.displaced
        ]


def _group(config: AppConfig, group: str, region: str, want: int, have: list[Current]) -> _Group:
    """A group in a region: what it wants, the machines it keeps (started first), and those of
    a group with services that preemption displaced (re-placed)."""
    displaced = [m for m in have if m.preempted] if config.served(group) else []
    kept = [m for m in have if m not in displaced]
    return _Group(group, region, want, sorted(kept, key=_started_first), displaced)


def desired_counts(config: AppConfig, group: str) -> dict[str, int]:
    """Machines of ``group`` per region: ``[regions]``, else in the primary region two for a
    group with services (high availability by default), one for a group without."""
    if config.regions:
        return dict(config.regions)
    return {config.primary_region: 2 if config.served(group) else 1}


def _regions(config: AppConfig, groups: list[_Group]) -> list[str]:
    seen = {g.region for g in groups}
    rest = sorted(seen - {config.primary_region})
    return [config.primary_region, *rest] if config.primary_region in seen else rest


def plan(config: AppConfig, machines: list[Current], strategy: str | None = None) -> list[Phase]:
    """The phases of a deploy of ``config`` over ``machines`` (the app's, not destroyed)."""
    strategy = strategy or config.deploy.strategy
    standbys = [m for m in machines if m.standby_for]
    machines = [m for m in machines if not m.standby_for]
    groups: list[_Group] = []
    known = set(config.groups())
    for group in config.groups():
        for region, want in desired_counts(config, group).items():
            have = [m for m in machines if m.group == group and m.region == region]
            groups.append(_group(config, group, region, want, have))
    # Machines of a group the config no longer has, or of a region it no longer names, go.
    placed = {(g.group, g.region) for g in groups}
    orphans = [m for m in machines if (m.group, m.region) not in placed or m.group not in known]
    cleanup = [
        *(Step("destroy", g.group, g.region, m.id) for g in groups for m in g.extra),
        *(step for g in groups for step in g.gone()),
        *(Step("destroy", m.group, m.region, m.id) for m in orphans),
    ]
    if strategy == "bluegreen":
        phases = _bluegreen(groups)
    elif strategy == "immediate":
        phases = _immediate(groups)
    else:
        phases = _rolling(config, groups)
        if strategy == "canary" and groups:
            first = next((g for g in groups if g.region == config.primary_region), groups[0])
            canary = Step("create", first.group, first.region, canary=True)
            phases.insert(0, Phase(f"canary {first.group} in {first.region}", (canary,)))
    # Standbys stand by for machines that stay (updated in place, still stopped); the others go.
    staying = {m.id for g in groups for m in g.keep} if strategy != "bluegreen" else set()
    kept = [s for s in standbys if set(s.standby_for) <= staying and not config.served(s.group)]
    if kept:
        steps = tuple(
            Step("update", s.group, s.region, s.id, standby_for=s.standby_for) for s in kept
        )
        phases.append(Phase("standbys", steps, wait_healthy=False))
    cleanup += [Step("destroy", s.group, s.region, s.id) for s in standbys if s not in kept]
    if cleanup:
        phases.append(Phase("cleanup", tuple(cleanup), wait_healthy=False))
    return phases


def scale(config: AppConfig, machines: list[Current], regions: Iterable[str]) -> list[Phase]:
    """The phases of a scale of the app to ``config``'s counts in ``regions`` only: the missing
    machines of each group created (healthy), then the extras destroyed, with their standbys."""
    standbys = [m for m in machines if m.standby_for]
    machines = [m for m in machines if not m.standby_for]
    creates: list[Step] = []
    going: list[Current] = []
    replaced: list[Step] = []
    for region in regions:
        for group in config.groups():
            have = [m for m in machines if m.group == group and m.region == region]
            g = _group(config, group, region, desired_counts(config, group).get(region, 0), have)
            creates += g.creates(region)
            going += g.extra
            replaced += g.gone()
    gone = {m.id for m in going}
    going += [s for s in standbys if set(s.standby_for) & gone]
    phases = [Phase("scale", tuple(creates))] if creates else []
    steps = (*(Step("destroy", m.group, m.region, m.id) for m in going), *replaced)
    if steps:
        phases.append(Phase("cleanup", steps, wait_healthy=False))
    return phases


def standbys_wanted(config: AppConfig, machines: list[Current]) -> list[Current]:
    """The machines of groups without services that have no standby yet."""
    covered = {primary for m in machines if m.standby_for for primary in m.standby_for}
    return [
        m
        for m in machines
        if not m.standby_for
        and m.id not in covered
        and m.group in config.groups()
        and not config.served(m.group)
    ]


def _started_first(m: Current) -> tuple[int, str]:
    """Which machines a group keeps when it has more than it wants: the started ones."""
    return (0 if m.state == "started" else 1, m.id)


def _at_rest_first(m: Current) -> tuple[int, str]:
    """The order a rolling deploy updates a group's machines in: those at rest first."""
    return (1 if m.state == "started" else 0, m.id)


def _immediate(groups: list[_Group]) -> list[Phase]:
    steps = [
        *(Step("update", g.group, g.region, m.id) for g in groups for m in g.keep),
        *(step for g in groups for step in g.creates(g.region)),
    ]
    return [Phase("immediate", tuple(steps), wait_healthy=False)] if steps else []


def _bluegreen(groups: list[_Group]) -> list[Phase]:
    green = tuple(Step("create", g.group, g.region) for g in groups for _ in range(g.want))
    blue = tuple(Step("destroy", g.group, g.region, m.id) for g in groups for m in g.keep)
    phases = [Phase("green", green)] if green else []
    if blue:
        phases.append(Phase("switch to green: blue destroyed", blue, wait_healthy=False))
    return phases


def _rolling(config: AppConfig, groups: list[_Group]) -> list[Phase]:
    phases: list[Phase] = []
    for region in _regions(config, groups):
        for g in (g for g in groups if g.region == region):
            batch = config.deploy.unavailable(g.want)
            keep = sorted(g.keep, key=_at_rest_first)
            for start in range(0, len(keep), batch):
                part = keep[start : start + batch]
                name = f"rolling {g.group} in {region} ({start + len(part)}/{len(keep)})"
                steps = tuple(Step("update", g.group, region, m.id) for m in part)
                phases.append(Phase(name, steps, region=region))
            if g.missing:
                steps = tuple(g.creates(region))
                phases.append(Phase(f"new {g.group} in {region}", steps, region=region))
    return phases
