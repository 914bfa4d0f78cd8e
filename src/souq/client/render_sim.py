"""How ``souq simulate`` prints: the ATC'23 experiment's table, a replay's report (``--tasks``,
``--engine fleet``) with what each priority class saw, and the comparison of
``--compare-preemption``; a part of the CLI's printer (:mod:`souq.client.render`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from souq.client.render import _grid, _json_or, _out, json_value

if TYPE_CHECKING:
    from pathlib import Path

    from souq.sim.departures import Report
    from souq.sim.experiment import Outcome
    from souq.sim.fleet import FleetReport
    from souq.sim.preemption_compare import Comparison

__all__ = [
    "class_rows",
    "experiment_outcomes",
    "fleet_replay",
    "preemption_comparison",
    "trace_replay",
]


def experiment_outcomes(outcomes: list[Outcome], plot: Path | None, *, as_json: bool) -> None:
    """The experiment's unallocated GPU share per policy at 100 % arrived, beside the paper's."""
    from souq.sim.experiment import PAPER

    if as_json:
        bodies = [o.as_json() for o in outcomes]
        json_value(bodies[0] if len(bodies) == 1 else bodies)
        return
    table = Table(title="Unallocated GPU % at 100 % arrived")
    for column in ("policy", "mean", "sd", "paper", "seeds", "slowest seed"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for o in outcomes:
        mean = o.mean_at_100
        paper = PAPER.get(o.policy)
        table.add_row(
            o.policy,
            "-" if mean is None else f"{mean:.2f}",
            f"{o.sd_at_100:.2f}",
            "" if paper is None else f"{paper:.2f}",
            str(len(o.runs)),
            f"{max(o.seconds):.1f} s",
        )
    console = _out()
    console.print(table)
    if plot is not None:
        console.print(f"figure: {plot}")


def class_rows(classes: dict[str, dict[str, Any]], preempt: int) -> list[tuple[str, str]]:
    """A replay report's lines for its priority classes (none when every task is standard
    and nothing was displaced)."""
    if set(classes) <= {"standard"} and not any(c["preempted"] for c in classes.values()):
        return []
    displaced = sum(int(c["preempted"]) for c in classes.values())
    rows = [
        (
            "preemption",
            f"at most {preempt} machines a create; {displaced} displaced"
            if preempt
            else "off (no create displaces another)",
        )
    ]
    for klass, c in classes.items():
        text = (
            f"{c['arrived']} arrived: {c['placed']} placed, {c['refused']} refused "
            f"({c['refused_pct']:g} %); {c['preempted']} displaced"
        )
        if c["preempted"]:
            w = c["preempted_wait_s"]
            text += (
                f", {c['placed_again']} placed again (waited p50 {w['p50']:g} s, p95 "
                f"{w['p95']:g} s, max {w['max']:g} s), {c['waiting_at_end']} waiting at the end"
            )
        text += f"; work lost {c['lost_core_s']:g} core-s"
        rows.append((klass, text))
    return rows


@_json_or
def preemption_comparison(c: Comparison) -> None:
    """The three runs of one policy side by side."""
    start, end = c.arms[0].report.window_s
    table = Table(
        title=f"What preemption buys ({c.policy}): allocated over capacity, {start:g} s to "
        f"{end:g} s"
    )
    columns = (
        "run",
        "cpu",
        "memory",
        "gpu",
        "reserved refused",
        "reserved lost",
        "displaced",
        "displaced wait p50 / p95 / max",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "run" else "right")
    for arm in c.arms:
        a = arm.as_json()
        u = a["window_utilisation"]
        wait = "; ".join(
            f"{klass} {w['p50']:g} / {w['p95']:g} / {w['max']:g} s"
            for klass, cls in arm.classes.items()
            if cls["placed_again"]
            for w in [cls["preempted_wait_s"]]
        )
        name = f"preemption (at most {arm.preempt})" if arm.name == "preemption" else arm.name
        table.add_row(
            name,
            f"{u.get('cpu', 0):g} %",
            f"{u.get('memory', 0):g} %",
            f"{u['gpu']:g} %" if "gpu" in u else "-",
            f"{a['reserved_refused']} ({a['reserved_refused_pct']:g} %)",
            f"{a['reserved_preempted']} displaced, {a['reserved_lost_core_s']:g} core-s",
            str(a["preemptions"]),
            wait or "-",
        )
    _out().print(table)


@_json_or
def trace_replay(r: Report) -> None:
    """A replay with departures: placed, failed by reason, allocation and the workers' CPU."""
    failed = ", ".join(f"{n} {reason}" for reason, n in sorted(r.failed_by_reason.items()))
    s = {k: f"{v:g} %" for k, v in r.summary().items()}
    rows = [
        ("policy", r.policy),
        ("tasks", f"{r.tasks} on {r.workers} workers: {r.placed} placed, {r.failed} failed"),
        ("failed", failed or "-"),
        ("allocated", f"cpu {s.get('cpu_mean')}, memory {s.get('memory_mean')}"
         + (f", gpu {s.get('gpu_mean')}" if "gpu_mean" in s else "")
         + f" (time-weighted mean of {len(r.samples)} samples)"),
        ("worker cpu p95", f"mean {s.get('worker_cpu_p95_mean')}, peak "
         f"{s.get('worker_cpu_p95_peak')}"),
        ("worker cpu max", f"mean {s.get('worker_cpu_max_mean')}"),
        ("hot workers", ", ".join(f"{k} {v:g} %" for k, v in r.hot.items())
         + f" of worker-time above {r.hot_threshold:g}"),
        *((f"worker {k}", f"p95 {h[k + '_p95']:g} %, max {h[k + '_max']:g} % (each over time)")
          for h in [r.host_utilisation] for k in r.hot),
    ]  # fmt: skip
    _out().print(_grid([*rows, *class_rows(r.classes, r.preempt)], bold_names=True))


@_json_or
def fleet_replay(r: FleetReport) -> None:
    """A fleet replay: placed, failed by reason, utilisation and hot spots over time, the
    hosts' p95 and max, waits and jobs."""
    failed = ", ".join(f"{n} {reason}" for reason, n in sorted(r.failed_by_reason.items()))
    util = ", ".join(f"{k} {v:g} %" for k, v in r.utilisation.items())
    hot = ", ".join(f"{k} {v:g} %" for k, v in r.hot.items())
    h = r.host_utilisation
    w, j = r.waits, r.jobs
    start, end = r.span_s
    queue = ", backfilled queue" if r.backfill else ", FIFO queue" if r.queue else ", no queue"
    mode = ("batch" if r.batch else "one by one") + queue
    rows = [
        ("policy", f"{r.policy} ({mode})"),
        ("tasks", f"{r.tasks} ({r.instances} instances) on {r.hosts} hosts: {r.placed} placed, "
         f"{r.failed} failed"),
        ("failed", failed or "-"),
        ("utilisation", f"{util} (time-weighted, {start:g} s to {end:g} s)"),
        ("hot hosts", f"{hot} of host-time above {r.hot_threshold:g}"),
        ("host cpu", f"p95 {h['cpu_p95']:g} %, max {h['cpu_max']:g} % (each host over time)"),
        ("host memory", f"p95 {h['memory_p95']:g} %, max {h['memory_max']:g} %"),
        ("waits", f"p50 {w['p50']:g} s, p95 {w['p95']:g} s, max {w['max']:g} s"),
        ("fragmented", ", ".join(f"{k} {v:g} %" for k, v in r.fragmentation.items())
         + " of the free capacity on hosts with no room for the task placed (mean)"),
        ("jobs", f"{j.get('completed', 0)} completed" + (
            f": completion p50 {j['jct_p50']:g} s, p95 {j['jct_p95']:g} s; slowdown mean "
            f"{j['slowdown_mean']:g}, p95 {j['slowdown_p95']:g}" if "jct_p50" in j else "")),
    ]  # fmt: skip
    _out().print(_grid([*rows, *class_rows(r.classes, r.preempt)], bold_names=True))
