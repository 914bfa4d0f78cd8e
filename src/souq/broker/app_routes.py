"""The app resource, as Fly's Machines API has it: ``POST /v1/apps`` creates one,
``GET /v1/apps[?org_slug=][&app_role=]`` lists them (``{"apps": [...]}``),
``GET /v1/apps/{app}`` shows one and ``DELETE /v1/apps/{app}`` destroys it with its machines.

Created apps are records in :mod:`souq.broker.app_store`; an app that was never created but has
machines (an implicit app) is found in the cluster view and answered the same way. A name is
free (``404``) only when it has neither: that is how Fly's clients test a name.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from souq.auth.tokens import ALL_APPS
from souq.broker.bodies import AppName, body_schema, json_response, parse_body
from souq.broker.cluster_routes import view_headers
from souq.broker.service import BrokerService
from souq.errors import Forbidden, NotFound, SouqError, Unavailable
from souq.model import Machine, MachineState
from souq.model.app import (
    App,
    AppDeleted,
    AppList,
    AppRecord,
    MachineCounts,
    NewApp,
    app_of,
)
from souq.view import AppCount

__all__ = ["apps_router", "listed_apps"]

_DESTROYS_AT_ONCE = 16  # machines of one app destroyed concurrently by a delete


def apps_router(service: BrokerService) -> APIRouter:
    router = APIRouter(tags=["apps"])
    store = service.app_store

    @router.post("/v1/apps", status_code=201, response_model=App, openapi_extra=body_schema(NewApp))
    async def create_app(
        request: Request,
        wait: Annotated[bool, Query(description="accepted (Fly's clients send it)")] = False,
    ) -> Response:
        """Create an app from flaps' body (``name``) or that of Fly's Machines API reference
        (``app_name``): ``name_taken`` when the name is in use, by a created app or by
        machines. ``org_slug`` is kept (default ``personal``): Souq has no organizations."""
        body = await parse_body(request, NewApp)
        request.state.audit_app = body.app  # the audit log files the call under the app
        _may_touch(request, body.app, "create")
        counts = await _counts(service, body.app)
        record = await (await store()).create(body, taken=counts.machines > 0)
        service.networks.forget(body.app)  # its machines are on the network it names now
        app = app_of(body.app, record, counts)
        assert app is not None
        return json_response(app, status_code=201)

    @router.get("/v1/apps", response_model=AppList)
    async def list_apps(
        request: Request,
        org_slug: Annotated[str, Query(description="only this organization's apps")] = "",
        app_role: Annotated[str, Query(description="only apps of this role")] = "",
    ) -> Response:
        """Every app: the created ones and those with machines not destroyed (the latter from
        the cluster view). An app's token sees its own app only. While the app store cannot be
        read (NATS or JetStream down), the apps with machines only, and the header
        ``X-Souq-App-Records: unavailable``."""
        headers = view_headers(service, from_view=True)
        try:
            records = await (await store()).all()
        except Unavailable:
            records = []
            headers["X-Souq-App-Records"] = "unavailable"
        apps = listed_apps(records, service.view.store.apps(), org_slug=org_slug, role=app_role)
        only = _token_app(request)
        if only is not None:
            apps = [a for a in apps if a.name == only]
        return Response(
            AppList(apps=apps).model_dump_json(), media_type="application/json", headers=headers
        )

    @router.get("/v1/apps/{app}", response_model=App)
    async def get_app(app: AppName) -> Response:
        """The app; ``404`` only when the name is free (never created, no machine)."""
        counts = await _counts(service, app)
        found = app_of(app, await (await store()).get(app), counts)
        if found is None:
            raise _no_app(app)
        return json_response(found)

    @router.delete("/v1/apps/{app}", response_model=AppDeleted)
    async def delete_app(app: AppName) -> Response:
        """Destroy the app: each of its machines (killed if it runs) by its worker, then its
        record. Its releases and secrets stay, under its name (docs/apps.md)."""
        apps = await store()
        record = await apps.get(app)
        machines = await service.list_machines(app)
        if record is None and not machines:
            raise _no_app(app)
        destroyed = await _destroy_all(service, app, machines)
        if record is not None:
            await apps.delete(app)
        service.networks.forget(app)
        return json_response(AppDeleted(name=app, destroyed_machines=destroyed))

    return router


def listed_apps(
    records: list[AppRecord], counted: list[AppCount], *, org_slug: str = "", role: str = ""
) -> list[App]:
    """The apps of ``records`` and ``counted`` (apps with machines), by name; only those of
    ``org_slug`` and ``role`` when given."""
    by_name = {r.name: r for r in records}
    counts = {
        c.app: MachineCounts(machines=c.machines, states=c.states, regions=c.regions)
        for c in counted
    }
    out = []
    for name in sorted(by_name.keys() | counts.keys()):
        app = app_of(name, by_name.get(name), counts.get(name))
        if app is None:
            continue
        if org_slug and app.organization.slug != org_slug:
            continue
        if role and app.app_role != role:
            continue
        out.append(app)
    return out


async def _counts(service: BrokerService, app: str) -> MachineCounts:
    """The app's machines, counted: from the view once it is complete, else from every worker."""
    rows = await service.list_rows(app)
    machines = [Machine.model_validate_json(body) for _, body in rows]
    return MachineCounts.of((str(m.state), m.region) for m in machines)


async def _destroy_all(service: BrokerService, app: str, machines: list[Machine]) -> list[str]:
    """Destroy every machine through the broker's destroy (each by its worker); the first error
    once all were tried (the app's record then stays: the delete can be sent again)."""
    gate = asyncio.Semaphore(_DESTROYS_AT_ONCE)

    async def destroy(machine: Machine) -> None:
        if machine.state in {MachineState.DESTROYING, MachineState.DESTROYED}:
            return  # going already
        async with gate:
            try:
                await service.destroy_machine(app, machine.id, force=True)
            except NotFound:
                return  # gone meanwhile

    results = await asyncio.gather(*(destroy(m) for m in machines), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors:
        if not isinstance(error, SouqError):
            raise error
    if errors:
        raise errors[0]
    return [m.id for m in machines]


def _token_app(request: Request) -> str | None:
    """The one app the request's token is for; None: every app (or a broker without tokens)."""
    grant: Any = request.scope.get("state", {}).get("grant")
    if grant is None or grant.app == ALL_APPS:
        return None
    return str(grant.app)


def _may_touch(request: Request, app: str, verb: str) -> None:
    only = _token_app(request)
    if only is not None and only != app:
        raise Forbidden(
            f"this token is for app {only}: it may not {verb} app {app}",
            hint=f"use a token of app {app}, or one of every app",
            details={"app": app},
        )


def _no_app(app: str) -> NotFound:
    return NotFound(
        f"no app named {app}: it was never created and has no machine",
        hint=f"create it (`souq apps create {app}`), or check the name (`souq apps list`)",
        details={"app": app},
    )
