"""The proxy's Prometheus metrics, per app, counted in plain integers.

A request costs a few integer additions (:meth:`AppStats.done`); the Prometheus families are
built only when scraped, by a collector over those integers. Names (all prefixed ``souq_proxy_``):

* ``souq_proxy_requests_total{app, code}``: answers by status class (``1xx`` … ``5xx``);
* ``souq_proxy_request_duration_seconds{app}``: from the request's head to its answer's end;
* ``souq_proxy_in_flight_requests{app}``: requests being answered;
* ``souq_proxy_queued_requests{app}``: requests waiting for a machine;
* ``souq_proxy_tunnels_open``, ``souq_proxy_upstream_idle_connections``,
  ``souq_proxy_client_connections``.

Requests for hosts that name no known app count under ``app=""``, so that made-up hosts cannot
grow the label set. Each proxy process counts its own requests.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = ["BUCKETS", "CONTENT_TYPE", "AppStats", "ProxyStats", "metrics_text"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class AppStats:
    """One app's counters; the relay updates them in place."""

    __slots__ = ("app", "buckets", "classes", "in_flight", "seconds")

    def __init__(self, app: str) -> None:
        self.app = app
        self.classes = [0] * 6  # by status // 100
        self.buckets = [0] * (len(BUCKETS) + 1)  # the last one is +Inf
        self.seconds = 0.0
        self.in_flight = 0

    def done(self, status: int, seconds: float) -> None:
        self.in_flight -= 1
        self.classes[status // 100 if 100 <= status < 600 else 5] += 1
        self.buckets[bisect_left(BUCKETS, seconds)] += 1
        self.seconds += seconds


class ProxyStats:
    """Every app's counters in one process, and the gauges read from the relay when scraped."""

    def __init__(self) -> None:
        self.apps: dict[str, AppStats] = {}
        self.unrouted = AppStats("")
        self.gauges: dict[str, Callable[[], int]] = {}
        self.queued: Callable[[], dict[str, int]] = dict

    def app(self, name: str) -> AppStats:
        stats = self.apps.get(name)
        if stats is None:
            stats = self.apps[name] = AppStats(name)
        return stats

    def all(self) -> list[AppStats]:
        return [self.unrouted, *(self.apps[name] for name in sorted(self.apps))]


class _Collector(Collector):
    def __init__(self, stats: ProxyStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "souq_proxy_requests", "requests answered, by status class", labels=["app", "code"]
        )
        duration = HistogramMetricFamily(
            "souq_proxy_request_duration_seconds",
            "from a request's head to the end of its answer",
            labels=["app"],
        )
        in_flight = GaugeMetricFamily(
            "souq_proxy_in_flight_requests", "requests being answered", labels=["app"]
        )
        for s in self.stats.all():
            for cls in range(1, 6):
                requests.add_metric([s.app, f"{cls}xx"], s.classes[cls])
            cumulative, buckets = 0, []
            for bound, n in zip((*map(str, BUCKETS), "+Inf"), s.buckets, strict=True):
                cumulative += n
                buckets.append((bound, cumulative))
            duration.add_metric([s.app], buckets, s.seconds)
            in_flight.add_metric([s.app], s.in_flight)
        queued = GaugeMetricFamily(
            "souq_proxy_queued_requests", "requests waiting for a machine", labels=["app"]
        )
        for app, n in sorted(self.stats.queued().items()):
            queued.add_metric([app], n)
        yield requests
        yield duration
        yield in_flight
        yield queued
        for name, read in sorted(self.stats.gauges.items()):
            gauge = GaugeMetricFamily(f"souq_proxy_{name}", name.replace("_", " "))
            gauge.add_metric([], read())
            yield gauge


def metrics_text(stats: ProxyStats) -> bytes:
    """The Prometheus text exposition of ``stats`` (for the control plane's admin port)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(stats))
    return generate_latest(registry)
