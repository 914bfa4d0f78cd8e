"""The operations on one machine are declared once (souq.operations), and what is made from the
declarations is there on a real cluster: the broker serves exactly the declared machine routes,
the worker answers every declared verb, and an operation declared with a handler and nothing
else (``memory``) works through the HTTP API, the Python client and the CLI."""

from __future__ import annotations

import asyncio
import json

import httpx
import nats

from souq.bus import subjects
from souq.model.machine import MachineState
from souq.operations import MACHINE, OPERATIONS
from souq.testing import Cluster, auth_headers
from tests.integration.images_harness import souq

APP = "ops"


def test_the_broker_serves_exactly_the_declared_machine_routes(cluster: Cluster) -> None:
    paths = httpx.get(f"{cluster.api_url}/openapi.json", timeout=30).json()["paths"]
    served = {
        (method.upper(), path)
        for path, methods in paths.items()
        if path.startswith(MACHINE)
        for method in methods
    }
    declared = {(op.method, op.route_path) for op in OPERATIONS}
    assert served == declared, (served - declared, declared - served)


def test_the_worker_answers_every_declared_verb(cluster: Cluster) -> None:
    """Each declared verb, sent to the worker with a body no verb accepts: a worker that
    knows the verb refuses the body (``invalid_input``); one that does not would answer
    ``unknown_verb``."""
    worker_id = cluster.client().workers()[0].id

    async def ask_each() -> dict[str, str]:
        bus = await nats.connect(cluster.nats.url, **cluster.nats_options())
        try:
            answers = {}
            for verb in sorted({op.verb for op in OPERATIONS}):
                msg = await bus.request(subjects.worker(worker_id, verb), b"[]", timeout=10)
                answers[verb] = json.loads(msg.data)["error"]["status"]
            return answers
        finally:
            await bus.close()

    answers = asyncio.run(ask_each())
    assert set(answers.values()) == {"invalid_input"}, answers


def test_an_operation_made_from_its_declaration_alone(cluster: Cluster) -> None:
    """``memory`` is its declaration, its reply's type and the worker's handler: its route,
    client call and CLI verb are made."""
    with cluster.client() as client:
        config = {"cmd": ["sleep", "600"], "guest": {"cpus": 0.1, "memory_mb": 96}}
        machine = client.create_machine(APP, "mad", config)
        client.wait(APP, machine.id, MachineState.STARTED, timeout=30)
        try:
            memory = client.operate("memory", APP, machine.id)
            assert memory.limit_mb == 96 and memory.processes >= 1
            assert memory.rss_mb > 0

            http = httpx.get(
                f"{cluster.api_url}/v1/apps/{APP}/machines/{machine.id}/memory",
                headers=auth_headers(),
                timeout=30,
            )
            assert http.status_code == 200 and http.json()["limit_mb"] == 96, http.text

            shown = souq(cluster, "machine", "memory", machine.id, "--app", APP, "--json")
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["limit_mb"] == 96
            text = souq(cluster, "machine", "memory", machine.id, "--app", APP)
            assert text.returncode == 0 and "limit_mb" in text.stdout, text

            client.stop(APP, machine.id)
            client.wait(APP, machine.id, MachineState.STOPPED, timeout=30)
            stopped = souq(cluster, "machine", "memory", machine.id, "--app", APP)
            assert stopped.returncode == 1, stopped
            assert "memory needs a started machine" in stopped.stderr, stopped.stderr
        finally:
            client.destroy(APP, machine.id, force=True)
