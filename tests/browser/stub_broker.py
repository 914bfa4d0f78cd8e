"""A stand-in broker for the dashboard's event-stream path: the page's own routes, plus the
endpoints of the cluster view (``/v1/events?follow=true``, ``/v1/apps``, ``/v1/regions``) in the
shapes of :mod:`souq.view`, over machines kept in memory. Machines change state only through the
API, and every change is published on the event stream, as the real broker does."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from souq.broker.ui import router as dashboard
from souq.natsserver import free_port
from souq.testing import wait_until

WORKERS = [
    {"id": "wa", "region": "mad", "state": "up", "capacity": {"cpus": 4, "memory_mb": 4096}},
    {"id": "wb", "region": "mad", "state": "up", "capacity": {"cpus": 4, "memory_mb": 4096}},
]


def _unrouted(_path: str) -> Any:
    """A route decorator that routes nothing: the endpoint is absent (404)."""
    return lambda handler: handler


# The stub's clock: every change is stamped a whole second after this (2026-01-01T00:00:00Z),
# as a broker's replayed log stamps changes with when they happened, long before the page asks:
# a page that stamps lines with its own clock is told apart.
EPOCH_MS = 1_767_225_600_000


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def make_app(*, cluster_view: bool = True) -> FastAPI:
    """Without ``cluster_view``, a broker from before the cluster view: no events, apps or
    regions (404), so the page must poll and be told the app."""
    api = FastAPI()
    api.include_router(dashboard)
    view_route = api.get if cluster_view else _unrouted  # the cluster view's endpoints
    machines: dict[str, dict[str, Any]] = {}
    listeners: list[asyncio.Queue[dict[str, Any]]] = []
    seq = 0
    changes = 0

    def stamp() -> str:
        """The time of the next change, by the stub's clock."""
        nonlocal changes
        changes += 1
        return _iso(EPOCH_MS + changes * 1000)

    def publish(machine: dict[str, Any], kind: str) -> None:
        nonlocal seq
        seq += 1
        ms = int(datetime.fromisoformat(machine["updated_at"]).timestamp() * 1000)
        event = {"type": kind, "status": machine["state"], "source": "user", "timestamp": ms}
        body = {
            "seq": seq,
            "kind": "machine",
            "timestamp": ms,
            "worker_id": machine["worker_id"],
            "region": machine["region"],
            "machine_id": machine["id"],
            "app": machine["app"],
            "state": machine["state"],
            "event": event,
        }
        for queue in listeners:
            queue.put_nowait(body)

    @api.get("/v1/workers")
    async def workers() -> JSONResponse:
        rows = []
        for w in WORKERS:
            mine = [m for m in machines.values() if m["worker_id"] == w["id"]]
            used = sum(m["config"]["guest"]["cpus"] for m in mine)
            mem = sum(m["config"]["guest"]["memory_mb"] for m in mine)
            rows.append({**w, "allocated": {"cpus": used, "memory_mb": mem}, "machines": len(mine)})
        return JSONResponse(rows)

    @view_route("/v1/regions")
    async def regions() -> JSONResponse:
        region = {"name": "mad", "workers": 2, "workers_up": 2, "workers_cordoned": 0}
        region |= {"workers_down": 0, "machines": len(machines), "fits": 16}
        region |= {"capacity": {"cpus": 8, "memory_mb": 8192}}
        region |= {"allocated": {"cpus": len(machines), "memory_mb": 128 * len(machines)}}
        history = [
            {
                "region": "mad",
                "price": p,
                "used": 0.5,
                "cpu_used": 0.5,
                "memory_used": 0.1,
                "at_ms": 1_767_225_600_000 + i,
            }
            for i, p in enumerate((0.01, 0.02))
        ]
        region |= {"spot_price": 0.02, "spot_price_used": 0.55, "spot_price_history": history}
        return JSONResponse([region])

    @view_route("/v1/apps")
    async def apps() -> JSONResponse:
        names = sorted({m["app"] for m in machines.values()})
        rows = [{"name": a, "machines": 1, "states": {}, "regions": []} for a in names]
        return JSONResponse({"apps": rows})

    @api.get("/v1/apps/{app}/machines")
    async def list_machines(app: str) -> JSONResponse:
        return JSONResponse([m for m in machines.values() if m["app"] == app])

    @api.get("/v1/apps/{app}/machines/{machine_id}")
    async def get_machine(app: str, machine_id: str) -> JSONResponse:
        if machine_id not in machines:
            return JSONResponse({"error": "no such machine", "status": "not_found"}, 404)
        return JSONResponse(machines[machine_id])

    @api.post("/v1/apps/{app}/machines", status_code=201)
    async def create(app: str, request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        machine_id = f"m{len(machines) + 1:04d}"
        offers = [
            {"worker_id": "wb", "scores": {"best-fit": 0.6}, "score": 0.6},
            {"worker_id": "wa", "rejected": "insufficient_cpu", "detail": "needs 1 cpu"},
        ]
        placement = {"request_id": "r1", "region": body["region"], "policy": "best-fit"}
        placement |= {"expected_offers": 2, "offers_received": 2, "offers": offers}
        placement |= {"rejections": {"insufficient_cpu": 1}, "winner": "wb"}
        placement |= {"claims": [{"worker_id": "wb", "ok": True}], "timings": {"total_ms": 3}}
        machines[machine_id] = machine = {
            "id": machine_id,
            "name": machine_id,
            "app": app,
            "region": body["region"],
            "worker_id": "wb",
            "state": "started",
            "config": {"cmd": ["sleep"], "guest": body["config"]["guest"]},
            "created_at": (created := stamp()),
            "updated_at": created,
            "restarts": 0,
            "placement": placement,
        }
        publish(machine, "launch")
        return JSONResponse(machine, 201)

    @api.post("/v1/apps/{app}/machines/{machine_id}/stop")
    async def stop(app: str, machine_id: str) -> JSONResponse:
        machine = machines[machine_id]
        machine["state"] = "stopped"
        machine["updated_at"] = stamp()
        publish(machine, "stop")
        return JSONResponse(machine)

    @view_route("/v1/events")
    async def events(follow: bool = False) -> StreamingResponse:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        listeners.append(queue)

        async def stream() -> AsyncIterator[str]:
            try:
                yield ": hello\n\n"
                while True:
                    body = await queue.get()
                    yield f"id: {body['seq']}\nevent: {body['kind']}\ndata: {json.dumps(body)}\n\n"
            finally:
                listeners.remove(queue)

        return StreamingResponse(stream(), media_type="text/event-stream")

    return api


@contextmanager
def running_stub(*, cluster_view: bool = True) -> Iterator[str]:
    """Serve the stub on a loopback port in a thread; yield its URL."""
    port = free_port()
    config = uvicorn.Config(
        make_app(cluster_view=cluster_view),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=10, message="the stub broker to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
