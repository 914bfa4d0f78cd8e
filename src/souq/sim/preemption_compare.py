"""What preemption buys: one trace replayed three ways, side by side.

1. **reserved only** — the trace's ``reserved`` tasks alone: the refusals reserved work sees
   when nothing else competes for the cluster (the operator who keeps batch work off it);
2. **no preemption** — every task, no create displacing any (``preempt=0``): the batch work
   fills the room and reserved creates are refused for it;
3. **preemption** — every task, a create that fits nowhere displacing lower classes (at most
   ``preempt`` machines, the broker's ``preempt_max_victims``); the displaced wait and start
   again.

Preemption pays when the third keeps the first's reserved refusals while using the second's
capacity (or more). Each run is measured over the same window, the whole trace's span (a run
of the reserved tasks alone, or one whose displaced tasks run later, has a span of its own).
Either engine runs it: ``run(tasks, preempt, window)`` replays the tasks and returns its report
(:class:`~souq.sim.departures.Report` or :class:`~souq.sim.fleet_report.FleetReport`).

Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from souq.model.choices import PriorityClass
from souq.sim.traces import Task, trace_window

__all__ = ["ARMS", "Arm", "Comparison", "compare"]

ARMS = ("reserved only", "no preemption", "preemption")


class _Classed(Protocol):
    @property
    def policy(self) -> str: ...

    @property
    def classes(self) -> dict[str, dict[str, Any]]: ...

    @property
    def window_s(self) -> tuple[float, float]: ...

    @property
    def window_utilisation(self) -> dict[str, float]: ...


@dataclass(frozen=True)
class Arm:
    """One of the three runs: its name, the most victims a create took, its report."""

    name: str
    preempt: int
    report: Any

    @property
    def utilisation(self) -> dict[str, float]:
        """Allocated over capacity, time-weighted, % per resource."""
        r = self.report
        if hasattr(r, "utilisation"):
            return dict(r.utilisation)
        summary = r.summary()
        names = {"cpu": "cpu_mean", "memory": "memory_mean", "gpu": "gpu_mean"}
        return {k: summary[v] for k, v in names.items() if v in summary}

    @property
    def window_utilisation(self) -> dict[str, float]:
        """The same, over the whole trace's span (each arm over the same window)."""
        return dict(self.report.window_utilisation)

    @property
    def classes(self) -> dict[str, dict[str, Any]]:
        return dict(self.report.classes)

    def as_json(self) -> dict[str, Any]:
        reserved = self.classes.get(PriorityClass.RESERVED, {})
        return {
            "arm": self.name,
            "preempt_max_victims": self.preempt,
            "utilisation": self.utilisation,
            "window_s": list(self.report.window_s),
            "window_utilisation": self.window_utilisation,
            "reserved_refused": reserved.get("refused", 0),
            "reserved_refused_pct": reserved.get("refused_pct", 0.0),
            "reserved_preempted": reserved.get("preempted", 0),
            "reserved_lost_core_s": reserved.get("lost_core_s", 0.0),
            "preemptions": sum(int(c["preempted"]) for c in self.classes.values()),
            "classes": self.classes,
        }


@dataclass(frozen=True)
class Comparison:
    policy: str
    arms: list[Arm]

    def as_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "arms": [a.as_json() for a in self.arms]}


def compare(
    run: Callable[[Sequence[Task], int, tuple[float, float]], _Classed],
    tasks: Sequence[Task],
    *,
    preempt: int,
) -> Comparison:
    """The three runs of ``tasks`` (:data:`ARMS`), the third displacing at most ``preempt``
    machines a create; ``run(tasks, preempt, window)`` each, all measured over the whole
    trace's span (``window``, :func:`~souq.sim.traces.trace_window`)."""
    reserved = [t for t in tasks if t.priority_class == PriorityClass.RESERVED]
    window = trace_window(tasks)
    arms = [
        Arm(ARMS[0], preempt, run(reserved, preempt, window)),
        Arm(ARMS[1], 0, run(tasks, 0, window)),
        Arm(ARMS[2], preempt, run(tasks, preempt, window)),
    ]
    return Comparison(arms[2].report.policy, arms)
