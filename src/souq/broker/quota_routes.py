"""Quotas (docs/quotas.md): ``GET|PUT|DELETE /v1/apps/{app}/quota`` and
``GET|PUT|DELETE /v1/orgs/{org}/quota``.

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
from souq.model.quota import QuotaLimits, QuotaView

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


def quotas_router(service: BrokerService) -> APIRouter:
    router = APIRouter(tags=["quotas"])
    quotas = service.quotas
    schema = body_schema(QuotaLimits)

    @router.get(APP_QUOTA, response_model=QuotaView)
    async def show_app_quota(app: AppName) -> Response:
        """The app's limits (null: none) and its use, pending reservations included."""
        return json_response(await quotas.show("app", app))

    @router.put(APP_QUOTA, response_model=QuotaView, openapi_extra=schema)
    async def set_app_quota(app: AppName, request: Request) -> Response:
        """Replace the app's limits (a field left out: no limit on it)."""
        limits = await parse_body(request, QuotaLimits)
        return json_response(await quotas.set_limits("app", app, limits))

    @router.delete(APP_QUOTA, status_code=204)
    async def clear_app_quota(app: AppName) -> Response:
        """No quota on the app any more (its ledger is dropped)."""
        await quotas.clear("app", app)
        return Response(status_code=204)

    @router.get(ORG_QUOTA, response_model=QuotaView)
    async def show_org_quota(org: OrgSlug) -> Response:
        return json_response(await quotas.show("org", org))

    @router.put(ORG_QUOTA, response_model=QuotaView, openapi_extra=schema)
    async def set_org_quota(org: OrgSlug, request: Request) -> Response:
        """Replace the organization's limits: over all its apps together."""
        limits = await parse_body(request, QuotaLimits)
        return json_response(await quotas.set_limits("org", org, limits))

    @router.delete(ORG_QUOTA, status_code=204)
    async def clear_org_quota(org: OrgSlug) -> Response:
        await quotas.clear("org", org)
        return Response(status_code=204)

    return router
