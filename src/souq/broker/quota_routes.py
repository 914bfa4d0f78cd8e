"""Quotas (docs/quotas.md): ``GET|PUT|DELETE /v1/apps/{app}/quota`` and
``GET|PUT|DELETE /v1/orgs/{org}/quota``; ``PUT|DELETE …/quota/{line}`` replaces (or drops)
one line of limits — ``all`` (every class, volumes' size included) or a priority class —
keeping the others.

Reading an app's quota needs the app's ``read`` scope; setting or clearing one needs the
cluster's ``admin`` (an app's own token, even its deploy token, may not raise its quota:
``souq.auth.routes``); an organization's, the cluster's ``read`` and ``admin``. The use cases
are :class:`souq.broker.quotas.Quotas`.
"""

# No ``from __future__ import annotations``: a scope's routes take its path parameter by a
# dependency given to :func:`_scope_routes`, which FastAPI finds only in an evaluated annotation.

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from souq.broker.bodies import app_name, body_schema, json_response, parse_body
from souq.broker.quotas import Quotas
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
    # An app's quota and an organization's take the same routes, each of its own scope.
    quotas = service.quotas
    _scope_routes(router, quotas, "app", APP_QUOTA, checked=app_name, who="the app")
    _scope_routes(
        router,
        quotas,
        "org",
        ORG_QUOTA,
        checked=_org_slug,
        who="the organization",
        over=", over all its apps together",
    )
    return router


def _scope_routes(
    router: APIRouter,
    quotas: Quotas,
    scope: Scope,
    path: str,
    *,
    checked: Callable[[str], Awaitable[str]],
    who: str,
    over: str = "",
) -> None:
    """``GET|PUT|DELETE`` of ``path`` and ``PUT|DELETE`` of its lines, on ``scope``'s quota of
    the name ``checked`` takes from the path (and checks); ``who`` and ``over`` (what its
    limits hold together) in their descriptions."""
    Name = Annotated[str, Depends(checked)]  # noqa: N806 (a type, as FastAPI reads it)
    whose = f"{who}'s"

    @router.get(
        path,
        response_model=QuotaView,
        name=f"show_{scope}_quota",
        description=f"{whose.capitalize()} limits (null: none) and its use, pending "
        "reservations included.",
    )
    async def show(name: Name) -> Response:
        return json_response(await quotas.show(scope, name))

    @router.put(
        path,
        response_model=QuotaView,
        openapi_extra=body_schema(QuotaLimits),
        name=f"set_{scope}_quota",
        description=f"Replace {whose} limits{over} (a field left out: no limit on it).",
    )
    async def set_limits(name: Name, request: Request) -> Response:
        limits = await parse_body(request, QuotaLimits)
        return json_response(await quotas.set_limits(scope, name, limits))

    @router.delete(
        path,
        status_code=204,
        name=f"clear_{scope}_quota",
        description=f"No quota on {who} any more (its ledger is dropped).",
    )
    async def clear(name: Name) -> Response:
        await quotas.clear(scope, name)
        return Response(status_code=204)

    @router.put(
        path + "/{line}",
        response_model=QuotaView,
        openapi_extra=body_schema(AllLimits),
        name=f"set_{scope}_quota_line",
        description=f"Replace one line of {whose} limits (`all` or a class), keeping the others.",
    )
    async def set_line(name: Name, line: Line, request: Request) -> Response:
        given = await _line_body(request, line)
        return json_response(await quotas.set_line(scope, name, line, given))

    @router.delete(
        path + "/{line}",
        response_model=QuotaView,
        name=f"clear_{scope}_quota_line",
        description=f"No limits on one line of {whose} (the others kept).",
    )
    async def clear_line(name: Name, line: Line) -> Response:
        return json_response(await quotas.set_line(scope, name, line, ClassLimits()))
