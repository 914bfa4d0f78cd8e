"""The cluster view's routes: ``GET /v1/regions`` and ``GET /v1/events`` (server-sent events),
and the headers that say how fresh a view-served answer is. (``GET /v1/apps`` is
:mod:`souq.broker.app_routes`'.)"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from souq.broker.metrics import CONTENT_TYPE
from souq.broker.service import BrokerService
from souq.broker.streams import SlotResponse
from souq.bus.codec import encode_many, with_members
from souq.clock import iso_from_ms
from souq.model import Resources, WorkerState
from souq.view import ClusterEvent, RegionSummary

__all__ = [
    "MachineFilter",
    "client_address",
    "cluster_router",
    "machines_response",
    "stale_machine_response",
    "view_headers",
]

KEEPALIVE_S = 15.0  # a comment line this often keeps idle streams (and proxies) open


def view_headers(service: BrokerService, *, from_view: bool) -> dict[str, str]:
    """``X-Souq-View``: ``view`` (answered from the cluster view) or ``workers`` (asked every
    worker); ``X-Souq-View-As-Of``: when every live worker last matched the view;
    ``X-Souq-View-Lag-Ms``: how late the last event reached the view."""
    status = service.view.status()
    headers = {
        "X-Souq-View": "view" if from_view else "workers",
        "X-Souq-View-Lag-Ms": str(status.lag_ms),
    }
    if status.as_of_ms is not None:
        headers["X-Souq-View-As-Of"] = iso_from_ms(status.as_of_ms)
    return headers


@dataclass(frozen=True)
class MachineFilter:
    """Fly's list parameters: ``region``, ``state`` (comma-separated, or repeated),
    ``include_deleted`` (destroyed machines the view still holds), ``summary`` (no config,
    events or checks)."""

    region: str | None = None
    states: frozenset[str] = frozenset()
    include_deleted: bool = False
    summary: bool = False

    def keeps(self, machine: dict[str, Any]) -> bool:
        if self.region is not None and machine.get("region") != self.region:
            return False
        return not self.states or machine.get("state") in self.states

    def shown(self, body: str) -> str:
        if not self.summary:
            return body
        machine = json.loads(body)
        for key in ("config", "events", "checks", "placement"):
            machine.pop(key, None)
        return json.dumps(machine, separators=(",", ":"))


async def machines_response(
    service: BrokerService, app: str, only: MachineFilter | None = None
) -> Response:
    """``GET /v1/apps/{app}/machines``: the machines with ``worker_state`` added."""
    only = only or MachineFilter()
    from_view = service.view.complete
    rows = await service.list_rows(app, destroyed=only.include_deleted)
    if only.region is not None or only.states:
        rows = [(w, b) for w, b in rows if only.keeps(json.loads(b))]
    states = {w: service.liveness.state_of(w) for w in {w for w, _ in rows}}
    content = encode_many([_with_worker_state(only.shown(b), states[w]) for w, b in rows])
    return Response(
        content, media_type="application/json", headers=view_headers(service, from_view=from_view)
    )


def stale_machine_response(service: BrokerService, app: str, machine_id: str) -> Response | None:
    """``GET ...machines/{id}?stale=true``: the view's copy, or None to ask the worker."""
    cached = service.cached_machine(app, machine_id)
    if cached is None:
        return None
    return Response(
        cached.model_dump_json(),
        media_type="application/json",
        headers=view_headers(service, from_view=True),
    )


def _with_worker_state(body: str, state: WorkerState | None) -> bytes:
    """A machine's JSON with ``worker_state`` added (``down`` when its worker is unknown)."""
    return with_members(body, {"worker_state": (state or WorkerState.DOWN).value})


def client_address(request: Request) -> str:
    """Whom a stream counts against: the token that asked (its id: narrowed copies count with
    it), else — on a broker without tokens — the client's address."""
    grant = request.scope.get("state", {}).get("grant")
    if grant is not None:
        return f"token {grant.token_id}"
    return request.client.host if request.client is not None else "unknown"


def _sse(event: ClusterEvent) -> str:
    return f"id: {event.seq}\nevent: {event.kind}\ndata: {event.model_dump_json()}\n\n"


def cluster_router(service: BrokerService) -> APIRouter:
    router = APIRouter(tags=["cluster"])

    @router.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        """Prometheus metrics, every name prefixed ``souq_``."""
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    @router.get("/v1/regions", response_model=list[RegionSummary])
    async def list_regions(
        cpus: Annotated[float, Query(gt=0, le=1024, description="size of one machine")] = 1,
        memory_mb: Annotated[int, Query(gt=0, description="size of one machine, MiB")] = 256,
    ) -> Response:
        """Regions, their workers, and how many more machines of the size given fit."""
        size = Resources(cpus=cpus, memory_mb=memory_mb)
        regions = await service.regions(size)
        content = encode_many([r.model_dump_json() for r in regions])
        return Response(content, media_type="application/json")

    @router.get(
        "/v1/events",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}, "description": "events"}},
    )
    async def events(  # noqa: PLR0917 (FastAPI passes the query's parameters by name)
        request: Request,
        app: str | None = None,
        worker: str | None = None,
        follow: bool = False,
        since: Annotated[int | None, Query(ge=0, description="resume after this id")] = None,
        last_event_id: Annotated[int | None, Header(alias="Last-Event-ID", ge=0)] = None,
    ) -> Response:
        """Machine, worker and batch job events as server-sent events, oldest first, from the
        ones this broker still holds; ``follow=true`` keeps the stream open for new ones.
        Resuming after an id whose successors are gone (or that another broker gave) first
        sends a ``gap`` event: re-list what you follow, then go on. A client may hold so many
        followed streams open at once (429 ``too_many_requests`` past that, see
        docs/limits.md)."""
        start = last_event_id if last_event_id is not None else (since or 0)
        body = _stream(service, start, app=app, worker=worker, follow=follow)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        if not follow:
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)
        client = client_address(request)
        service.streams.take(client)
        return SlotResponse(
            body,
            media_type="text/event-stream",
            headers=headers,
            slots=service.streams,
            client=client,
        )

    return router


async def _stream(
    service: BrokerService, seq: int, *, app: str | None, worker: str | None, follow: bool
) -> AsyncIterator[str]:
    log = service.view.events
    if follow:
        yield ": souq events\n\n"  # headers and a first line at once: the stream is open
    while True:
        gap = log.missed(seq)
        if gap is not None:  # say so before going on from what is held
            yield f"event: gap\ndata: {gap.model_dump_json()}\n\n"
            seq = gap.resume_from - 1
        batch = log.since(seq, app=app, worker=worker)
        seq = max(seq, log.last_seq)
        if batch:
            yield "".join(_sse(e) for e in batch)
        if not follow:
            return
        if not await log.wait_after(seq, KEEPALIVE_S):
            yield ": keepalive\n\n"
