"""Each host's utilisation per resource, integrated over virtual time: the hot-spot figures of
a replay with departures (:mod:`souq.sim.departures`).

Between two changes the hosts do not change, so each host's utilisation (allocated over its
capacity, per resource) times the interval is added when the next change comes. From that:

* ``hot``: per resource, the share of host-time during which a host was above the threshold
  (a fraction of its capacity), %;
* ``hosts``: each host's utilisation averaged over time, as the p95 (nearest rank) and the max
  over the hosts, %.

Resources are ``cpu`` and ``memory``, and ``gpu`` where some host has GPUs (over those hosts
only: a host without GPUs is never GPU-hot). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from souq.errors import InvalidInput
from souq.model.resources import GPU_MILLI, Resources

__all__ = ["HostTime"]


class HostTime:
    def __init__(self, capacities: Sequence[Resources], *, hot: float, start: float) -> None:
        if not 0 <= hot <= 1:
            raise InvalidInput(
                f"hot {hot!r}: a share of a host's capacity, from 0 to 1",
                details={"field": "hot"},
            )
        self.hot = hot
        caps = [
            [c.millicpus for c in capacities],
            [c.memory_mb for c in capacities],
            [c.gpus * GPU_MILLI for c in capacities],
        ]
        self.resources = ("cpu", "memory", "gpu") if any(caps[2]) else ("cpu", "memory")
        cap = np.array(caps[: len(self.resources)], dtype=np.float64)
        self._has = cap > 0  # a host counts for a resource it has
        cap[~self._has] = np.inf
        self._cap = cap
        self._used = np.zeros_like(cap)
        self._area = np.zeros_like(cap)  # utilisation x seconds, per resource and host
        self._hot = np.zeros(len(self.resources))  # host-seconds above the threshold
        self.start = self.last = start

    def charge(self, host: int, want: Resources, sign: int, now: float) -> None:
        """``sign`` machines of ``want`` came to (or left) ``host`` at ``now``."""
        self.advance(now)
        used = self._used[:, host]
        used[0] += sign * want.millicpus
        used[1] += sign * want.memory_mb
        if len(self.resources) > 2:
            used[2] += sign * (want.gpus * GPU_MILLI + want.gpu_milli)

    def advance(self, now: float) -> None:
        """The hosts as they stand held from the last change until ``now``."""
        dt = now - self.last
        if dt <= 0:
            return
        util = self._used / self._cap
        self._area += util * dt
        self._hot += np.count_nonzero(util > self.hot, axis=1) * dt
        self.last = now

    def report(self) -> tuple[dict[str, float], dict[str, float]]:
        """``hot`` (share of host-time above the threshold, %) and ``hosts`` (each host's
        time-averaged utilisation: p95 and max over the hosts, %), per resource."""
        span = self.last - self.start
        hot: dict[str, float] = {}
        hosts: dict[str, float] = {}
        for k, name in enumerate(self.resources):
            has = self._has[k]
            n = int(has.sum())
            hot[name] = round(100 * float(self._hot[k]) / (n * span), 3) if n and span else 0.0
            mean = self._area[k][has] / span if span > 0 else np.zeros(n)
            hosts[f"{name}_p95"] = round(100 * _nearest(mean, 95), 3)
            hosts[f"{name}_max"] = round(100 * float(mean.max()), 3) if n else 0.0
        return hot, hosts


def _nearest(values: np.ndarray[Any, Any], p: float) -> float:
    n = len(values)
    if n == 0:
        return 0.0
    k = max(1, math.ceil(p / 100 * n)) - 1
    return float(np.partition(values, k)[k])
