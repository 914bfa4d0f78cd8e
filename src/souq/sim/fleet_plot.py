"""The fleet replay's figure: utilisation, the hosts' p95 and waits over time.

Needs matplotlib (``pip install 'souq[sim]'``); :func:`souq.sim.experiment.require_plotting`
says so before a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from souq.sim.fleet_report import FleetReport

__all__ = ["plot_timeline"]


def plot_timeline(reports: Sequence[FleetReport], path: Path) -> None:
    """Per report (one line each): cluster CPU and memory allocated, the hosts' p95 CPU, and
    how long the task at the queue's head has waited, against time (hours from the first
    arrival)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for r in reports:
        start = r.span_s[0]
        hours = [(s.t - start) / 3600 for s in r.timeline]
        label = f"{r.policy}{'' if r.batch else ' (one by one)'}"
        axes[0].plot(hours, [s.cpu for s in r.timeline], label=f"{label} cpu")
        axes[0].plot(hours, [s.memory for s in r.timeline], "--", label=f"{label} memory")
        axes[1].plot(hours, [s.host_cpu_p95 for s in r.timeline], label=f"{label} cpu p95")
        axes[1].plot(
            hours, [s.host_memory_p95 for s in r.timeline], "--", label=f"{label} memory p95"
        )
        axes[2].plot(hours, [s.head_wait / 60 for s in r.timeline], label=label)
    axes[0].set_ylabel("allocated, %")
    axes[1].set_ylabel("host p95, %")
    axes[1].axhline(100 * reports[0].hot_threshold, color="grey", linewidth=0.5)
    axes[2].set_ylabel("queue head's wait, min")
    axes[2].set_xlabel("hours from the first arrival")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
