"""An app's secrets (:mod:`souq.secrets`, sealed in JetStream's key-value store):
``POST /v1/apps/{app}/secrets`` sets some (``{"NAME": "VALUE", ...}``, or Fly's
``{"values": {...}}``), ``GET`` lists them (names, digests, when set: never a value, as
``{"secrets": [...], "version": N}``), ``GET|POST|DELETE …/secrets/{name}`` shows, sets and
unsets one. Agents put them in a machine's env at its next start or update.

Every route needs the ``deploy`` scope of the app (``souq.auth.routes``; its table lets a
``read`` token list names and digests).
"""

from __future__ import annotations

from typing import Annotated

import pydantic_core
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import RootModel

from souq.auth.access import Permit
from souq.auth.files import AuthDir
from souq.auth.tokens import Scope
from souq.broker.bodies import AppName, body_schema, json_response, parse_body, parsed_body
from souq.broker.service import BrokerService
from souq.bus.jetstream import OnFirstUse
from souq.errors import InvalidInput, NotFound
from souq.model.base import Input
from souq.model.secrets import SecretInfo
from souq.secrets.sealed import check_name, check_values
from souq.secrets.store import SecretStore, open_bucket, secrets_key

__all__ = ["secrets_router", "skips_secrets"]

SECRETS = "/v1/apps/{app}/secrets"


class SecretValues(RootModel[dict[str, str]]):
    """``{"NAME": "VALUE", ...}``: environment variable names and their values."""


class FlyValues(Input):
    """Fly's ``{"values": {"NAME": "VALUE" or null}}``: null unsets the secret."""

    values: dict[str, str | None]


class OneValue(Input):
    """Fly's ``{"value": "VALUE"}`` for one secret."""

    value: str


def fly_shaped(raw: bytes) -> bool:
    """Whether a body is Fly's ``{"values": {...}}`` (a Souq body's values are strings)."""
    try:
        data = pydantic_core.from_json(raw)  # bounded recursion: a deep body is not JSON here
    except ValueError:
        return False
    return isinstance(data, dict) and data.keys() == {"values"} and isinstance(data["values"], dict)


def skips_secrets(permit: Permit, app: str, *, asked: bool) -> bool:
    """Whether a machine this create or update makes starts without its app's secrets, at
    this start and every later one: when the body asks (Fly's ``skip_secrets``), and always
    when the token may not read them (``deploy``: a ``write`` token's machine could print them
    for a ``read`` token to see in its logs). Kept on the machine, so whoever starts it later,
    and its restart policy, start it as the token that made it could."""
    return asked or not permit.allows(app, Scope.DEPLOY)


def never_shown(show_secrets: bool) -> None:
    if show_secrets:
        raise InvalidInput(
            "show_secrets: not supported by Souq (a secret's value is never shown)",
            hint="read it inside a machine of the app, from its environment",
        )


async def at_least(kept: SecretStore, version: int | None) -> None:
    """Fly's ``?version=N``: the secrets as of that version or later (what is kept now)."""
    if version is not None and version > await kept.version():
        raise NotFound(f"secrets version {version} does not exist yet")


async def fly_listing(kept: SecretStore, app: str) -> Response:
    secrets = [i.model_dump(mode="json") for i in await kept.of_app(app)]
    return JSONResponse({"secrets": secrets, "version": await kept.version()})


async def fly_secret(kept: SecretStore, app: str, name: str) -> Response:
    found = await kept.info(app, name)
    if found is None:
        raise NotFound(f"app {app} has no secret {name}")
    return JSONResponse({**found.model_dump(mode="json"), "version": await kept.version()})


def secrets_router(service: BrokerService, auth: AuthDir | None) -> APIRouter:
    router = APIRouter(tags=["secrets"])

    async def open_store() -> SecretStore:
        key = secrets_key(auth)  # secrets_unavailable (503) without an auth directory
        return SecretStore(await open_bucket(service.nats_client()), key, on_write=wrote)

    def wrote(version: int) -> None:
        service.secrets_version = max(service.secrets_version, version)

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
        """Set secrets of the app (names checked, values bounded); what is kept of each. Fly's
        body, ``{"values": {"NAME": "VALUE" or null}}`` (null unsets), is answered in Fly's
        shape: ``{"secrets": [...], "version": N}``."""
        raw = await request.body()
        kept = await store()
        if not fly_shaped(raw):
            souq = parsed_body(raw, SecretValues)
            return json_response(await kept.set(app, check_values(souq.root)))
        given = parsed_body(raw, FlyValues).values
        if not given:
            raise InvalidInput("no secrets given", hint='send {"values": {"NAME": "VALUE"}}')
        values = {k: v for k, v in given.items() if v is not None}
        if values:
            await kept.set(app, check_values(values))
        for name in (k for k, v in given.items() if v is None):
            await kept.unset(app, name, missing_ok=True)
        return await fly_listing(kept, app)

    @router.get(SECRETS)  # scope: deploy (the table: read)
    async def list_secrets(
        app: AppName,
        version: Annotated[int | None, Query(ge=0, description="Fly's: at least this")] = None,
        show_secrets: Annotated[bool, Query(description="Fly's; values are never shown")] = False,
    ) -> Response:
        """``{"secrets": [{name, digest, set_at, updated_at}], "version": N}``: names and
        digests, never a value."""
        never_shown(show_secrets)
        kept = await store()
        await at_least(kept, version)
        return await fly_listing(kept, app)

    @router.get(SECRETS + "/{name}", response_model=SecretInfo)  # scope: deploy
    async def show_secret(
        app: AppName,
        name: str,
        version: Annotated[int | None, Query(ge=0, description="Fly's: at least this")] = None,
        show_secrets: Annotated[bool, Query(description="Fly's; values are never shown")] = False,
    ) -> Response:
        never_shown(show_secrets)
        kept = await store()
        await at_least(kept, version)
        return await fly_secret(kept, app, check_name(name))

    @router.post(  # scope: deploy
        SECRETS + "/{name}", response_model=SecretInfo, openapi_extra=body_schema(OneValue)
    )
    async def set_secret(app: AppName, name: str, request: Request) -> Response:
        """Fly's: set one secret (``{"value": "..."}``); the secret and the new version."""
        body = await parse_body(request, OneValue)
        kept = await store()
        await kept.set(app, check_values({check_name(name): body.value}))
        return await fly_secret(kept, app, name)

    @router.delete(SECRETS + "/{name}")  # scope: deploy
    async def unset_secret(app: AppName, name: str) -> Response:
        """Unset one secret: ``{"version": N}`` (Fly's answer)."""
        kept = await store()
        await kept.unset(app, name)
        return JSONResponse({"version": await kept.version()})

    return router
