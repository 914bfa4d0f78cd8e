"""Quotas (docs/quotas.md): ``GET|PUT|DELETE /v1/apps/{app}/quota`` and
``GET|PUT|DELETE /v1/orgs/{org}/quota``; ``PUT|DELETE …/quota/{line}`` replaces (or drops)
one line of limits — ``all`` (every class, volumes' size included) or a priority class —
keeping the others.

Reading an app's quota needs the app's ``read`` scope; setting or clearing one needs the
cluster's ``admin`` (an app's own token, even its deploy token, may not raise its quota:
``souq.auth.routes``); an organization's, the cluster's ``read`` and ``admin``. The use cases
are :class:`souq.broker.quotas.Quotas`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from souq.broker.bodies import AppName, body_schema, json_response, parse_body
from souq.broker.service import BrokerService
from souq.errors import InvalidInput
from souq.model.quota import (
    ALL_CLASSES,
    CLASSES,
    AllLimits,
    ClassLimits,
    QuotaLimits,
    QuotaView,
    Scope,
)

__all__ = ["quotas_router"]

APP_QUOTA = "/v1/apps/{app}/quota"
ORG_QUOTA = "/v1/orgs/{org}/quota"


async def _org_slug(org: str) -> str:
    from souq.model.app import NewApp

    try:
        NewApp(name="x", org_slug=org)
    except ValueError as exc:
        raise InvalidInput(f"org slug {org!r} is not valid", details={"field": "org"}) from exc
    return org


OrgSlug = Annotated[str, Depends(_org_slug)]
LINES = (ALL_CLASSES, *CLASSES)


async def _line(line: str) -> str:
    if line not in LINES:
        raise InvalidInput(
            f"class: {line!r} is not a quota line: one of {', '.join(LINES)}",
            details={"field": "class", "fields": [{"field": "class", "message": "unknown"}]},
        )
    return line


Line = Annotated[str, Depends(_line)]


async def _line_body(request: Request, line: str) -> ClassLimits:
    """A line's limits: ``all`` takes ``volume_gb`` too (volumes have no class)."""
    return await parse_body(request, AllLimits if line == ALL_CLASSES else ClassLimits)


def quotas_router(service: BrokerService) -> APIRouter:
    router = APIRouter(tags=["quotas"])
    quotas = service.quotas
    schema = body_schema(QuotaLimits)

    @router.get(APP_QUOTA, response_model=QuotaView)
    async def show_app_quota(app: AppName) -> Response:
        """The app's limits (null: none) and its use, pending reservations included."""
        return json_response(await quotas.show("app", app))

    # An app's quota and an organization's take the same changes, of their scope.
    async def set_limits(scope: Scope, name: str, request: Request) -> Response:
        limits = await parse_body(request, QuotaLimits)
        return json_response(await quotas.set_limits(scope, name, limits))

    async def clear(scope: Scope, name: str) -> Response:
        await quotas.clear(scope, name)
        return Response(status_code=204)

    @router.put(APP_QUOTA, response_model=QuotaView, openapi_extra=schema)
    async def set_app_quota(app: AppName, request: Request) -> Response:
        """Replace the app's limits (a field left out: no limit on it)."""
        return await set_limits("app", app, request)

    @router.delete(APP_QUOTA, status_code=204)
    async def clear_app_quota(app: AppName) -> Response:
        """No quota on the app any more (its ledger is dropped)."""
        return await clear("app", app)

    async def set_line(scope: Scope, name: str, line: str, request: Request) -> Response:
        given = await _line_body(request, line)
        return json_response(await quotas.set_line(scope, name, line, given))

    async def clear_line(scope: Scope, name: str, line: str) -> Response:
        return json_response(await quotas.set_line(scope, name, line, ClassLimits()))

    line_schema = body_schema(AllLimits)

    @router.put(APP_QUOTA + "/{line}", response_model=QuotaView, openapi_extra=line_schema)
    async def set_app_quota_line(app: AppName, line: Line, request: Request) -> Response:
        """Replace one line of the app's limits (``all`` or a class), keeping the others."""
        return await set_line("app", app, line, request)

    @router.delete(APP_QUOTA + "/{line}", response_model=QuotaView)
    async def clear_app_quota_line(app: AppName, line: Line) -> Response:
        """No limits on one line of the app's (the others kept)."""
        return await clear_line("app", app, line)

    @router.put(ORG_QUOTA + "/{line}", response_model=QuotaView, openapi_extra=line_schema)
    async def set_org_quota_line(org: OrgSlug, line: Line, request: Request) -> Response:
        return await set_line("org", org, line, request)

    @router.delete(ORG_QUOTA + "/{line}", response_model=QuotaView)
    async def clear_org_quota_line(org: OrgSlug, line: Line) -> Response:
        return await clear_line("org", org, line)

    @router.get(ORG_QUOTA, response_model=QuotaView)
    async def show_org_quota(org: OrgSlug) -> Response:
        return json_response(await quotas.show("org", org))

    @router.put(ORG_QUOTA, response_model=QuotaView, openapi_extra=schema)
    async def set_org_quota(org: OrgSlug, request: Request) -> Response:
        """Replace the organization's limits: over all its apps together."""
        return await set_limits("org", org, request)

    @router.delete(ORG_QUOTA, status_code=204)
    async def clear_org_quota(org: OrgSlug) -> Response:
        return await clear("org", org)

    return router
