"""What the proxy's control plane did and why: wake-ups, autostops, failovers, health changes.

A bounded ring, newest last, served as JSON on the proxy's admin port (``GET /decisions``) and
logged as it happens, so that an operator can ask why a machine was started or stopped. Each
kind also counts into Prometheus (``souq_proxy_control_total{kind, app}``) and wake-ups into a
latency histogram (``souq_proxy_wakeup_seconds{app}``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["Decision", "Decisions", "Kind"]

log = logging.getLogger(__name__)

Kind = Literal[
    "wake", "wake_failed", "autostop", "failover", "unhealthy", "healthy", "drain", "tcp_port"
]
WAKE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Decision:
    at_ms: int
    kind: Kind
    app: str
    machine_id: str | None
    reason: str
    seconds: float | None = None  # a wake-up: from the request's need to the port accepting


class Decisions:
    def __init__(self, registry: CollectorRegistry | None = None, capacity: int = 1000) -> None:
        self._ring: deque[Decision] = deque(maxlen=capacity)
        self.registry = registry or CollectorRegistry()
        self._counts = Counter(
            "souq_proxy_control",
            "Control-plane decisions of the proxy, by kind",
            ["kind", "app"],
            registry=self.registry,
        )
        self._wake = Histogram(
            "souq_proxy_wakeup_seconds",
            "From a request finding no machine to a woken machine's port accepting",
            ["app"],
            buckets=WAKE_BUCKETS,
            registry=self.registry,
        )

    def record(
        self,
        kind: Kind,
        app: str,
        machine_id: str | None,
        reason: str,
        *,
        seconds: float | None = None,
    ) -> Decision:
        d = Decision(int(time.time() * 1000), kind, app, machine_id, reason, seconds)
        self._ring.append(d)
        self._counts.labels(kind, app).inc()
        if kind == "wake" and seconds is not None:
            self._wake.labels(app).observe(seconds)
        log.info("%s %s %s: %s", kind, app, machine_id or "-", reason)
        return d

    def recent(self, app: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        picked = [d for d in self._ring if app is None or d.app == app]
        return [asdict(d) for d in picked[-limit:]]
