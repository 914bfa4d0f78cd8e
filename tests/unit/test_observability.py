"""JSON log lines carry the ids bound to their context; the agent's metrics server answers."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

import httpx

from souq.agent.metrics import AgentCollector, serve_metrics
from souq.agent.stats import AgentStats
from souq.logs import JsonFormatter, bind, current, log_context
from souq.model import MachineState, Resources


def _line(logger: logging.Logger, formatter: JsonFormatter, text: str) -> dict[str, object]:
    record = logger.makeRecord(logger.name, logging.INFO, __file__, 1, text, (), None)
    parsed: dict[str, object] = json.loads(formatter.format(record))
    return parsed


def test_json_lines_carry_the_context_ids_and_drop_them_after() -> None:
    logger = logging.getLogger("souq.test")
    formatter = JsonFormatter()
    with log_context(request_id="r1", machine_id="m1", app=None):
        line = _line(logger, formatter, "claimed")
        assert {k: line[k] for k in ("request_id", "machine_id", "msg", "level")} == {
            "request_id": "r1",
            "machine_id": "m1",
            "msg": "claimed",
            "level": "info",
        }
        assert "app" not in line
    assert "request_id" not in _line(logger, formatter, "after")
    assert current() == {}


def test_bind_adds_to_the_current_context() -> None:
    with log_context(request_id="r2"):
        bind(machine_id="m2")
        assert current() == {"request_id": "r2", "machine_id": "m2"}
    assert current() == {}


@dataclass
class Row:
    state: MachineState
    restarts: int


def test_the_agent_serves_machines_by_state_and_restarts() -> None:
    rows = [
        Row(MachineState.STARTED, 2),
        Row(MachineState.STARTED, 0),
        Row(MachineState.STOPPED, 1),
    ]
    text = _scrape(AgentCollector("w1", lambda: rows))
    assert 'souq_agent_machines{state="started",worker="w1"} 2.0' in text
    assert 'souq_agent_machine_restarts_total{worker="w1"} 3.0' in text


def test_the_agent_serves_its_claims_capacity_and_bus_state() -> None:
    stats = AgentStats(
        capacity=lambda: Resources(cpus=4, memory_mb=2048),
        allocated=lambda: Resources(cpus=1.5, memory_mb=512),
        pending_events=lambda: 3,
        connected=lambda: False,
    )
    stats.claimed("accepted")
    stats.claimed("accepted")
    stats.claimed("cordoned")
    stats.offers = 7
    stats.last_heartbeat = time.time() - 5
    text = _scrape(AgentCollector("w1", list, stats))
    assert 'souq_agent_capacity{resource="cpus",worker="w1"} 4.0' in text
    assert 'souq_agent_allocated{resource="memory_mb",worker="w1"} 512.0' in text
    assert 'souq_agent_claims_total{outcome="accepted",worker="w1"} 2.0' in text
    assert 'souq_agent_claims_total{outcome="cordoned",worker="w1"} 1.0' in text
    assert 'souq_agent_offers_total{worker="w1"} 7.0' in text
    assert 'souq_agent_events_pending{worker="w1"} 3.0' in text
    assert 'souq_agent_bus_connected{worker="w1"} 0.0' in text
    age = next(x for x in text.splitlines() if x.startswith("souq_agent_heartbeat_age_seconds{"))
    assert 5.0 <= float(age.rsplit(" ", 1)[1]) < 60


def _scrape(collector: AgentCollector) -> str:
    """What the agent's metrics endpoint serves for ``collector``, over real HTTP."""
    server = serve_metrics(0, collector)
    try:
        return httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    finally:
        server.close()
