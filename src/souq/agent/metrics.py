"""The agent's Prometheus metrics on ``--metrics-port`` (0, the default, serves none), names
prefixed ``souq_agent_``: machines by state and restarts (read from the executor's records when
scraped), capacity and allocation by resource, claims by outcome (and refusals by reason), offers
answered, machine events waiting to be published, whether the bus is connected, and the age of
the last heartbeat sent.

Served by prometheus_client's own HTTP server in a thread; a scrape only reads a snapshot of the
records (one ``list()`` of them) and of :class:`AgentStats` (plain counters the event loop bumps),
so it never waits for the event loop. Imported only when a metrics port is set: an agent without
one does not load ``prometheus_client`` (about 2 MiB)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from souq.agent.stats import RESOURCES, AgentStats

__all__ = ["AgentCollector", "AgentStats", "MetricsServer", "serve_metrics"]


class _Row(Protocol):
    @property
    def restarts(self) -> int: ...


class AgentCollector(Collector):
    def __init__(
        self,
        worker_id: str,
        rows: Callable[[], Iterable[object]],
        stats: AgentStats | None = None,
    ) -> None:
        self._worker_id = worker_id
        self._rows = rows
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        rows = list(self._rows())
        by_state: dict[str, int] = {}
        restarts = 0
        for row in rows:
            state = str(getattr(getattr(row, "state", None), "value", "unknown"))
            by_state[state] = by_state.get(state, 0) + 1
            restarts += int(getattr(row, "restarts", 0) or 0)
        machines = GaugeMetricFamily(
            "souq_agent_machines", "this worker's machines, by state", labels=["worker", "state"]
        )
        for state, n in sorted(by_state.items()):
            machines.add_metric([self._worker_id, state], n)
        yield machines
        total = CounterMetricFamily(
            "souq_agent_machine_restarts",
            "restarts of this worker's machines by their restart policy",
            labels=["worker"],
        )
        total.add_metric([self._worker_id], restarts)
        yield total
        if self._stats is not None:
            yield from self._collect_stats(self._stats)

    def _collect_stats(
        self, stats: AgentStats
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        w = self._worker_id
        for name, source, what in (
            ("souq_agent_capacity", stats.capacity, "what this worker offers, by resource"),
            ("souq_agent_allocated", stats.allocated, "what its machines reserve, by resource"),
        ):
            if source is None:
                continue
            family = GaugeMetricFamily(name, what, labels=["worker", "resource"])
            amounts = source()
            for resource in RESOURCES:
                family.add_metric([w, resource], float(getattr(amounts, resource, 0) or 0))
            yield family
        claims = CounterMetricFamily(
            "souq_agent_claims",
            "claims answered: accepted, or refused with the refusal's reason",
            labels=["worker", "outcome"],
        )
        for outcome, n in sorted(dict(stats.claims).items()):
            claims.add_metric([w, outcome], n)
        yield claims
        offers = CounterMetricFamily(
            "souq_agent_offers", "requests for offers answered", labels=["worker"]
        )
        offers.add_metric([w], stats.offers)
        yield offers
        gauges: list[tuple[str, str, Callable[[], float] | None]] = [
            (
                "souq_agent_events_pending",
                "machine events waiting to be published (they wait out a bus outage)",
                stats.pending_events,
            ),
            (
                "souq_agent_bus_connected",
                "1 while the agent is connected to NATS",
                None if stats.connected is None else _as_number(stats.connected),
            ),
            (
                "souq_agent_heartbeat_age_seconds",
                "seconds since this worker last sent a heartbeat",
                None if stats.last_heartbeat is None else _age(stats.last_heartbeat),
            ),
        ]
        for name, what, read in gauges:
            if read is not None:
                gauge = GaugeMetricFamily(name, what, labels=["worker"])
                gauge.add_metric([w], float(read()))
                yield gauge


def _as_number(flag: Callable[[], bool]) -> Callable[[], float]:
    return lambda: 1.0 if flag() else 0.0


def _age(since: float) -> Callable[[], float]:
    return lambda: max(0.0, time.time() - since)


class MetricsServer:
    def __init__(self, close: Callable[[], None], port: int) -> None:
        self._close = close
        self.port = port

    def close(self) -> None:
        self._close()


def serve_metrics(port: int, collector: Collector, host: str = "127.0.0.1") -> MetricsServer:
    registry = CollectorRegistry()
    registry.register(collector)
    server, thread = start_http_server(port, addr=host, registry=registry)

    def close() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return MetricsServer(close, server.server_address[1])
