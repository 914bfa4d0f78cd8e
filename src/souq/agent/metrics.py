"""The agent's Prometheus metrics on ``--metrics-port`` (0, the default, serves none): machines by
state and restarts, read from the executor's records when scraped; names prefixed ``souq_``.

Served by prometheus_client's own HTTP server in a thread; a scrape only reads a snapshot of the
records (one ``list()`` of them), so it never waits for the event loop."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["AgentCollector", "MetricsServer", "serve_metrics"]


class _Row(Protocol):
    @property
    def restarts(self) -> int: ...


class AgentCollector(Collector):
    def __init__(self, worker_id: str, rows: Callable[[], Iterable[object]]) -> None:
        self._worker_id = worker_id
        self._rows = rows

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
