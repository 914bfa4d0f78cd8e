"""Small statistics helpers shared by the benchmarks."""

from __future__ import annotations

import platform
import statistics
from datetime import UTC, datetime

import psutil


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_ms(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50": round(statistics.median(ms), 3),
        "p90": round(percentile(ms, 90), 3),
        "p99": round(percentile(ms, 99), 3),
        "max": round(max(ms), 3),
    }


def machine_line() -> str:
    return (
        f"{platform.node()} · {psutil.cpu_count()} cores · "
        f"{psutil.virtual_memory().total // 2**30} GiB · Python {platform.python_version()} · "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}"
    )
