"""An app's secrets (:mod:`souq.secrets`, sealed in JetStream's key-value store):
``POST /v1/apps/{app}/secrets`` sets some (``{"NAME": "VALUE", ...}``), ``GET`` lists them
(names, digests, when set: never a value), ``DELETE …/secrets/{name}`` unsets one. Agents put
them in a machine's env at its next start or update.

Every route needs the ``deploy`` scope of the app (``souq.auth.routes``; its table lets a
``read`` token list names and digests).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import RootModel

from souq.auth.files import AuthDir
from souq.broker.bodies import AppName, body_schema, json_response, parse_body
from souq.broker.service import BrokerService
from souq.bus.jetstream import OnFirstUse
from souq.model.secrets import SecretInfo
from souq.secrets.sealed import check_values
from souq.secrets.store import SecretStore, open_bucket, secrets_key

__all__ = ["secrets_router"]

SECRETS = "/v1/apps/{app}/secrets"


class SecretValues(RootModel[dict[str, str]]):
    """``{"NAME": "VALUE", ...}``: environment variable names and their values."""


def secrets_router(service: BrokerService, auth: AuthDir | None) -> APIRouter:
    router = APIRouter(tags=["secrets"])

    async def open_store() -> SecretStore:
        key = secrets_key(auth)  # secrets_unavailable (503) without an auth directory
        return SecretStore(await open_bucket(service.nats_client()), key)

    opened = OnFirstUse(open_store)

    async def store() -> SecretStore:
        secrets_key(auth)  # each time: the error names what is missing, before NATS is asked
        return await opened.get()

    @router.post(  # scope: deploy
        SECRETS,
        response_model=list[SecretInfo],
        openapi_extra=body_schema(SecretValues),
    )
    async def set_secrets(app: AppName, request: Request) -> Response:
        """Set secrets of the app (names checked, values bounded); what is kept of each."""
        values = check_values((await parse_body(request, SecretValues)).root)
        return json_response(await (await store()).set(app, values))

    @router.get(SECRETS, response_model=list[SecretInfo])  # scope: deploy (the table: read)
    async def list_secrets(app: AppName) -> Response:
        return json_response(await (await store()).of_app(app))

    @router.delete(SECRETS + "/{name}", status_code=204)  # scope: deploy
    async def unset_secret(app: AppName, name: str) -> Response:
        await (await store()).unset(app, name)
        return Response(status_code=204)

    return router
