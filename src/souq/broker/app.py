"""The HTTP API: thin routes over :class:`BrokerService`. Each route parses its input, calls one
use case and answers JSON; errors are answered by :mod:`souq.broker.http_errors`.

Request bodies are parsed here rather than by FastAPI so that they are validated as JSON against
Souq's strict models (unknown keys rejected, no silent coercion), and so that a body that is not
JSON at all is told apart (400 ``malformed_request``) from a wrong field (422 ``invalid_input``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Header, Query, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel
from starlette.datastructures import Headers, QueryParams
from starlette.types import ASGIApp

from souq import __version__
from souq.auth.access import Access, Permit, permit_of
from souq.broker import machine_logs as output
from souq.broker.app_routes import apps_router
from souq.broker.bodies import (
    MACHINE,
    AppName,
    app_name,
    body_schema,
    json_response,
    parse_body,
    parsed_body,
    with_fields,
)
from souq.broker.change_routes import changes_router
from souq.broker.cluster_routes import (
    MachineFilter,
    client_address,
    cluster_router,
    machines_response,
    stale_machine_response,
)
from souq.broker.fast_path import CreateFastPath, CreateHandler
from souq.broker.http_errors import install_error_handlers
from souq.broker.image_routes import images_router
from souq.broker.lifecycle_routes import lifecycle_router
from souq.broker.machine_tools_routes import machine_tools_router
from souq.broker.op_routes import operations_router
from souq.broker.quota_routes import quotas_router
from souq.broker.release_routes import releases_router
from souq.broker.request_context import RequestContext
from souq.broker.sched_routes import sched_router
from souq.broker.schemas import (
    CreateMachineRequest,
    DryRun,
    ErrorBody,
    Health,
    LeaseBody,
    ListedMachine,
    QuoteRequest,
    SignalRequest,
    StopRequest,
    UpdateMachineRequest,
)
from souq.broker.secret_routes import secrets_router, skips_secrets
from souq.broker.service import BrokerService
from souq.broker.streams import SlotResponse
from souq.broker.token_routes import Guard, tokens_router
from souq.broker.volume_routes import volumes_router
from souq.errors import InvalidInput, SouqError
from souq.http_limits import BodyLimit, RouteLimit
from souq.jobs.queue import JobQueue
from souq.limits import BODY_IMAGE_BYTES
from souq.model import (
    Machine,
    Quote,
    WorkerInfo,
)
from souq.model.app import NewApp
from souq.model.batch import BatchCreateRequest, BatchResult
from souq.model.protocol import LeaseRequest
from souq.model.release import NewRelease, ReleaseUpdate
from souq.view.store import machine_text

__all__ = ["BODY_LIMITS", "create_app"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

# Every other route takes bodies of up to souq.limits.BODY_DEFAULT_BYTES.
BODY_LIMITS = (RouteLimit("POST", "/v1/images", BODY_IMAGE_BYTES, "POST /v1/images"),)

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        400: "the body is not JSON (`malformed_request`)",
        413: "the body is over the route's limit (`payload_too_large`)",
        404: "no such machine (`not_found`)",
        429: "too many streams open (`too_many_requests`)",
        409: "`illegal_transition`, `idempotency_conflict`, `quote_used`, `insufficient_capacity`",
        422: "a field is invalid (`invalid_input`, `unknown_region`)",
        503: "NATS or the owning worker is unreachable (`unavailable`)",
    }.items()
}


_CREATE_PARAMETERS = [
    {
        "name": "Idempotency-Key",
        "in": "header",
        "required": False,
        "schema": {"type": "string", "maxLength": 255},
        "description": "the same key (and body) never makes two machines",
    },
    {
        "name": "dry_run",
        "in": "query",
        "required": False,
        "schema": {"type": "boolean", "default": False},
        "description": "answer 200 with the placement record; claim nothing",
    },
]
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def _idempotency_key(headers: Headers) -> str | None:
    key = headers.get("idempotency-key")
    if key is not None and len(key) > 255:
        raise InvalidInput(
            "Idempotency-Key: at most 255 characters", details={"field": "Idempotency-Key"}
        )
    return key


def _flag(query: QueryParams, name: str) -> bool:
    value = query.get(name)
    if value is None:
        return False
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise InvalidInput(
        f"{name}: {value!r} is not a boolean (use true or false)", details={"field": name}
    )


def create_handler(service: BrokerService) -> CreateHandler:
    """``POST /v1/apps/{app}/machines``: 201 with the machine, or 200 with the placement record
    of a dry run. The route reads its path, header and query itself (see
    :mod:`souq.broker.fast_path`)."""

    async def create(
        app: str, raw: bytes, headers: Headers, query: QueryParams, permit: Permit
    ) -> tuple[int, str]:
        await app_name(app)
        idempotency_key = _idempotency_key(headers)
        body = parsed_body(raw, CreateMachineRequest)
        body = body.model_copy(
            update={"skip_secrets": skips_secrets(permit, app, asked=body.skip_secrets)}
        )
        if _flag(query, "dry_run"):
            return 200, DryRun(placement=await service.explain(app, body)).model_dump_json()
        machine = await service.create_machine(app, body, idempotency_key=idempotency_key)
        if body.lease_ttl is None:
            return 201, machine_text(machine)  # the view's row of it is made of the same text
        # Fly's lease_ttl: the machine is made leased; its nonce is in the answer.
        lease = await service.take_lease(
            LeaseRequest(app=app, machine_id=machine.id, ttl_s=float(body.lease_ttl))
        )
        return 201, with_fields(machine.model_dump_json(), {"nonce": lease.nonce})

    return create


def _add_durability_routes(api: FastAPI, service: BrokerService) -> None:
    """A worker's drain (docs/protocol.md, "Dry runs, quotes and cordons")."""

    @api.post("/v1/workers/{worker_id}/drain", response_model=WorkerInfo, tags=["cluster"])
    async def drain_worker(worker_id: str) -> Response:
        """Cordon the worker and stop its machines gracefully; ``uncordon`` ends the drain."""
        return json_response(await service.calls.drain(worker_id))


def create_app(
    service: BrokerService, guard: Guard | None = None, jobs: JobQueue | None = None
) -> ASGIApp:
    """The broker's ASGI app. The caller owns ``service``, ``guard`` and ``jobs`` (starts and
    closes them). With a guard, every route but the public ones needs a token
    (:mod:`souq.auth`)."""
    create = create_handler(service)
    api = _routes(service, create)
    api.include_router(sched_router(jobs or JobQueue(service.nats_client)))  # /sched: batch jobs
    auth = guard.auth if guard is not None else None
    api.include_router(secrets_router(service, auth))  # an app's secrets (JetStream, sealed)
    api.include_router(apps_router(service))  # /v1/apps, /v1/apps/{app}: the app resource
    api.include_router(machine_tools_router(service))  # a machine's exec and metadata
    api.include_router(volumes_router(service))  # /v1/apps/{app}/volumes: Fly's volumes
    api.include_router(quotas_router(service))  # /v1/apps/{app}/quota, /v1/orgs/{org}/quota
    inner: ASGIApp = CreateFastPath(api, create)
    if guard is not None:
        api.include_router(tokens_router(guard))
        inner = Access(inner, guard.verifier, guard.audit.record)
    # Outermost: a request id on every answer and log line; then bodies over their route's
    # limit refused before anything reads them; then the token's check (before any body is
    # read); then the create's fast path.
    return RequestContext(BodyLimit(inner, routes=BODY_LIMITS))


def _routes(service: BrokerService, create: CreateHandler) -> FastAPI:
    api = FastAPI(
        title="Souq Machines API",
        version=__version__,
        description="Place and run machines on a Souq cluster.",
        separate_input_output_schemas=False,
        responses=_ERRORS,
    )
    install_error_handlers(api)
    _install_openapi(
        api,
        [
            CreateMachineRequest,
            QuoteRequest,
            StopRequest,
            SignalRequest,
            BatchCreateRequest,
            UpdateMachineRequest,
            LeaseBody,
            NewRelease,
            ReleaseUpdate,
            NewApp,
        ],
    )

    @api.get("/healthz", response_model=Health, tags=["cluster"])
    async def healthz() -> Response:
        """200 while the broker is connected to the bus; 503 ``unavailable`` while it is not."""
        service.require_bus()
        return json_response(
            Health(workers=service.liveness.live_count(), nats_server=service.nats_server())
        )

    @api.get("/v1/workers", response_model=list[WorkerInfo], tags=["cluster"])
    async def list_workers() -> Response:
        return json_response(await service.workers())

    @api.post(
        "/v1/apps/{app}/machines",
        status_code=201,
        response_model=Machine,
        openapi_extra={**body_schema(CreateMachineRequest), "parameters": _CREATE_PARAMETERS},
        tags=["machines"],
    )
    async def create_machine(request: Request) -> Response:
        """Answered by :mod:`souq.broker.fast_path` before FastAPI sees it; declared here for
        the API's schema."""
        status, content = await create(
            request.path_params["app"],
            await request.body(),
            request.headers,
            request.query_params,
            permit_of(request.scope.get("state")),
        )
        return Response(content, status_code=status, media_type="application/json")

    @api.post(
        "/v1/apps/{app}/machines/batch",
        status_code=201,
        response_model=BatchResult,
        openapi_extra=body_schema(BatchCreateRequest),
        tags=["machines"],
    )
    async def create_batch(
        app: AppName,
        request: Request,
        idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
    ) -> Response:
        """Place ``count`` machines of one config at once (see souq.broker.batch)."""
        if idempotency_key is not None:
            raise InvalidInput(
                "a batch create takes no Idempotency-Key (yet)",
                hint="send single creates with a key, or retry a batch only after listing",
            )
        body = await parse_body(request, BatchCreateRequest)
        permit = permit_of(request.scope.get("state"))
        body = body.model_copy(
            update={
                "skip_secrets": skips_secrets(permit, app, asked=body.skip_secrets),
                "min_secrets_version": max(body.min_secrets_version, service.secrets_version),
            }
        )
        return json_response(await service.create_batch(app, body), status_code=201)

    @api.post(
        "/v1/apps/{app}/quotes",
        status_code=201,
        response_model=Quote,
        openapi_extra=body_schema(QuoteRequest),
        responses={410: {"model": ErrorBody, "description": "`quote_expired`"}},
        tags=["quotes"],
    )
    async def create_quote(app: AppName, request: Request) -> Response:
        body = await parse_body(request, QuoteRequest)
        return json_response(await service.create_quote(app, body), status_code=201)

    @api.get("/v1/apps/{app}/quotes/{quote_id}", response_model=Quote, tags=["quotes"])
    async def get_quote(app: AppName, quote_id: str) -> Response:
        return json_response(await service.get_quote(app, quote_id))

    @api.delete("/v1/apps/{app}/quotes/{quote_id}", response_model=Quote, tags=["quotes"])
    async def release_quote(app: AppName, quote_id: str) -> Response:
        return json_response(await service.release_quote(app, quote_id))

    @api.post("/v1/workers/{worker_id}/cordon", response_model=WorkerInfo, tags=["cluster"])
    async def cordon_worker(worker_id: str) -> Response:
        return json_response(await service.calls.cordon(worker_id, cordoned=True))

    @api.post("/v1/workers/{worker_id}/uncordon", response_model=WorkerInfo, tags=["cluster"])
    async def uncordon_worker(worker_id: str) -> Response:
        return json_response(await service.calls.cordon(worker_id, cordoned=False))

    @api.get("/v1/apps/{app}/machines", response_model=list[ListedMachine], tags=["machines"])
    async def list_machines(
        app: AppName,
        *,
        region: Annotated[str | None, Query(description="only this region's")] = None,
        state: Annotated[
            list[str] | None, Query(description="only in these states (comma-separated)")
        ] = None,
        include_deleted: Annotated[
            bool, Query(description="destroyed ones too (as the view still holds them)")
        ] = False,
        summary: Annotated[bool, Query(description="without config, events, checks")] = False,
    ) -> Response:
        """The app's machines, from the cluster view (see the ``X-Souq-View*`` headers);
        ``worker_state`` says whether each one's worker is ``up``, ``cordoned`` or ``down``."""
        states = frozenset(s.strip() for given in state or () for s in given.split(",") if s)
        only = MachineFilter(region, states, include_deleted, summary)
        return await machines_response(service, app, only)

    @api.get(MACHINE, response_model=Machine, tags=["machines"])
    async def get_machine(
        app: AppName,
        machine_id: str,
        stale: Annotated[
            bool, Query(description="accept the cluster view's copy instead of the worker's")
        ] = False,
    ) -> Response:
        cached = stale_machine_response(service, app, machine_id) if stale else None
        return cached or json_response(await service.get_machine(app, machine_id))

    api.include_router(lifecycle_router(service))  # start, stop, restart, destroy, wait

    @api.get(
        MACHINE + "/logs",
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {}}, "description": "the machine's output"}},
        tags=["machines"],
    )
    async def machine_logs(
        app: AppName, machine_id: str, request: Request, follow: bool = False
    ) -> Response:
        if not follow:
            return PlainTextResponse(await output.logs(service, app, machine_id))
        await service.get_machine(app, machine_id)  # a 404 before the stream starts
        client = client_address(request)
        service.streams.take(client)  # 429 past the streams one client may hold
        return SlotResponse(
            _until_error(output.follow_logs(service, app, machine_id)),
            media_type="text/plain; charset=utf-8",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            slots=service.streams,
            client=client,
        )

    _add_durability_routes(api, service)
    api.include_router(cluster_router(service))  # /v1/regions, /v1/events
    api.include_router(images_router(service))  # /v1/images: the cluster's image store
    api.include_router(changes_router(service))  # a machine's update, its lease
    api.include_router(operations_router(service))  # souq.operations: the routes made
    api.include_router(releases_router(service))  # an app's releases (JetStream)

    from souq.broker.ui import router as dashboard

    api.include_router(dashboard)  # GET /ui: the read-only dashboard over this API
    return api


async def _until_error(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """A stream already under way cannot change its status: it ends at the first error."""
    try:
        async for chunk in chunks:
            yield chunk
    except SouqError as exc:
        log.warning("a followed log stream ended early: %s", exc)


def _install_openapi(api: FastAPI, bodies: Sequence[type[BaseModel]]) -> None:
    """FastAPI's schema, plus the request bodies that the routes parse themselves."""

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            schema = get_openapi(
                title=api.title,
                version=api.version,
                description=api.description,
                routes=api.routes,
                separate_input_output_schemas=False,
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in bodies:
                extra = model.model_json_schema(ref_template="#/components/schemas/{model}")
                for name, definition in extra.pop("$defs", {}).items():
                    components.setdefault(name, definition)
                components.setdefault(model.__name__, extra)
            api.openapi_schema = schema
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]
