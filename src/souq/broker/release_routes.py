"""An app's releases (:mod:`souq.broker.releases`, in JetStream's key-value store):
``POST /v1/apps/{app}/releases`` makes the next version, ``GET`` lists them (newest first) or
shows one, ``POST …/releases/{version}`` records its deploy's progress. A deploy
(``souq deploy``) drives them; the broker keeps nothing of them itself."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from souq.broker.bodies import AppName, body_schema, json_response, parse_body
from souq.broker.releases import ReleaseStore
from souq.broker.service import BrokerService
from souq.bus.jetstream import OnFirstUse
from souq.model.release import NewRelease, Release, ReleaseUpdate

__all__ = ["releases_router"]

RELEASES = "/v1/apps/{app}/releases"


def releases_router(service: BrokerService) -> APIRouter:
    router = APIRouter(tags=["releases"])
    store = OnFirstUse(lambda: ReleaseStore.open(service.nats_client())).get

    @router.post(
        RELEASES, status_code=201, response_model=Release, openapi_extra=body_schema(NewRelease)
    )
    async def create_release(app: AppName, request: Request) -> Response:
        """A new release of the app, at its next version (`pending`)."""
        body = await parse_body(request, NewRelease)
        return json_response(await (await store()).create(app, body), status_code=201)

    @router.get(RELEASES, response_model=list[Release])
    async def list_releases(app: AppName) -> Response:
        return json_response(await (await store()).of_app(app))

    @router.get(RELEASES + "/{version}", response_model=Release)
    async def show_release(app: AppName, version: int) -> Response:
        return json_response(await (await store()).get(app, version))

    @router.post(
        RELEASES + "/{version}", response_model=Release, openapi_extra=body_schema(ReleaseUpdate)
    )
    async def update_release(app: AppName, version: int, request: Request) -> Response:
        """Record how the release's deploy went: `deploying`, `complete`, `failed` (with the
        reason), `rolled_back`."""
        body = await parse_body(request, ReleaseUpdate)
        return json_response(await (await store()).update(app, version, body))

    return router
