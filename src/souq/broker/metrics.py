"""The broker's Prometheus metrics (``GET /metrics``), every name prefixed ``souq_``.

Counters and histograms are fed by :class:`BrokerService` as placements finish; gauges about the
cluster (machines by state, heartbeat age per worker, the view's lag) are read from the cluster
view and the worker table when scraped. Each broker has its own registry (no global state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from souq.model import Placement, WorkerInfo
from souq.view import ViewStatus

__all__ = ["CONTENT_TYPE", "BrokerMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_PHASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_OFFER_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)


@dataclass(frozen=True)
class _ClusterCollector(Collector):
    """Gauges read when scraped: what :meth:`BrokerMetrics.watch` names."""

    workers: Callable[[], list[WorkerInfo]]
    view: Callable[[], ViewStatus]
    states: Callable[[], dict[str, int]]
    now_ms: Callable[[], int]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_state = GaugeMetricFamily(
            "souq_machines", "machines in the cluster view, by state", labels=["state"]
        )
        for state, n in sorted(self.states().items()):
            by_state.add_metric([state], n)
        yield by_state
        age = GaugeMetricFamily(
            "souq_worker_heartbeat_age_seconds",
            "seconds since each worker's last heartbeat",
            labels=["worker", "region", "state"],
        )
        workers = GaugeMetricFamily(
            "souq_workers", "workers known, by region and state", labels=["region", "state"]
        )
        counts: dict[tuple[str, str], int] = {}
        now = self.now_ms()
        for w in self.workers():
            if w.last_seen is not None:
                age.add_metric([w.id, w.region, w.state.value], max(0, now - w.last_seen) / 1000)
            key = (w.region, w.state.value)
            counts[key] = counts.get(key, 0) + 1
        for (region, state), n in sorted(counts.items()):
            workers.add_metric([region, state], n)
        yield age
        yield workers
        status = self.view()
        for name, documentation, value in (
            (
                "souq_view_lag_seconds",
                "how late the last machine event reached the view",
                status.lag_ms / 1000,
            ),
            ("souq_view_bytes", "bytes the cluster view's database holds", status.bytes),
            ("souq_view_rows", "machine rows in the view (tombstones too)", status.machines),
            (
                "souq_view_complete",
                "1 when every live worker is synced into the view",
                1 if status.complete else 0,
            ),
        ):
            gauge = GaugeMetricFamily(name, documentation)
            gauge.add_metric([], value)
            yield gauge


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.placements = Counter(
            "souq_placements",
            "create requests placed or not, by outcome (placed, or the error status)",
            ["outcome"],
            registry=self.registry,
        )
        self.placement_seconds = Histogram(
            "souq_placement_seconds",
            "placement latency by phase (gather, rank, claim, total)",
            ["phase"],
            buckets=_PHASE_BUCKETS,
            registry=self.registry,
        )
        self.offers = Histogram(
            "souq_offers_per_request",
            "offers received per placement",
            buckets=_OFFER_BUCKETS,
            registry=self.registry,
        )
        self.refused_claims = Counter(
            "souq_refused_claims",
            "claims a worker refused (another broker won the race, or it filled up)",
            registry=self.registry,
        )

    def watch(
        self,
        workers: Callable[[], list[WorkerInfo]],
        view: Callable[[], ViewStatus],
        states: Callable[[], dict[str, int]],
        now_ms: Callable[[], int],
    ) -> None:
        self.registry.register(_ClusterCollector(workers, view, states, now_ms))

    def placed(self, outcome: str, record: Placement | None) -> None:
        self.placements.labels(outcome).inc()
        if record is None:
            return
        t = record.timings
        for phase, ms in (
            ("gather", t.gather_ms),
            ("rank", t.rank_ms),
            ("claim", t.claim_ms),
            ("total", t.total_ms),
        ):
            self.placement_seconds.labels(phase).observe(ms / 1000)
        self.offers.observe(record.offers_received)
        refused = sum(1 for c in record.claims if not c.ok)
        if refused:
            self.refused_claims.inc(refused)

    def render(self) -> bytes:
        return generate_latest(self.registry)
