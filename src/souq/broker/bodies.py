"""Request and response bodies of the JSON routes: parsed into a model (a typo or a bad value
is ``invalid_input`` naming the field), written from one, and declared for OpenAPI; and what
the routes of a machine share in their path (:data:`MACHINE`, :data:`AppName`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Header, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from souq.broker.http_errors import invalid_input
from souq.broker.schemas import check_app_name
from souq.bus.codec import encode_many, with_members
from souq.errors import InvalidInput, MalformedRequest
from souq.operations import MACHINE  # the path of one machine's routes

__all__ = [
    "MACHINE",
    "AppName",
    "LeaseNonce",
    "app_name",
    "body_schema",
    "json_response",
    "parse_body",
    "parsed_body",
    "with_fields",
]

M = TypeVar("M", bound=BaseModel)


def body_schema(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": ref}}}}


async def parse_body(request: Request, model: type[M], *, optional: bool = False) -> M:
    return parsed_body(await request.body(), model, optional=optional)


def parsed_body(raw: bytes, model: type[M], *, optional: bool = False) -> M:
    if not raw.strip():
        if optional:
            return model()
        raise MalformedRequest(
            "the request body is empty",
            hint="send a JSON object with Content-Type: application/json",
        )
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise invalid_input(exc.errors()) from exc


def json_response(
    value: BaseModel | Sequence[BaseModel],
    status_code: int = 200,
    *,
    extra: Mapping[str, Any] | None = None,
) -> Response:
    """``extra``: fields added at the end of one model's object (:func:`with_fields`)."""
    if isinstance(value, BaseModel):
        body = value.model_dump_json()
        content = with_members(body, dict(extra)) if extra else body.encode()
    else:
        content = encode_many([v.model_dump_json() for v in value])
    return Response(content, status_code=status_code, media_type="application/json")


def with_fields(body: str, fields: Mapping[str, Any]) -> str:
    """A JSON object's text (a model's dump) with ``fields`` added at its end, its members read
    one level deep only: Fly's extra fields on a Souq answer."""
    return with_members(body, dict(fields)).decode()


async def app_name(app: str) -> str:
    """``app`` when it is a valid app name; ``invalid_input`` naming what is wrong else."""
    problem = check_app_name(app)
    if problem:
        raise InvalidInput(problem)
    return app


# An ``{app}`` path parameter, checked (``invalid_input`` naming what is wrong).
AppName = Annotated[str, Depends(app_name)]


async def lease_nonce(
    souq: Annotated[
        str | None,
        Header(alias="souq-lease-nonce", description="the nonce of the machine's lease"),
    ] = None,
    fly: Annotated[
        str | None,
        Header(alias="fly-machine-lease-nonce", description="the same, by Fly's name"),
    ] = None,
) -> str | None:
    """The lease nonce a request carries, under Souq's header or Fly's."""
    if souq and fly and souq != fly:
        raise InvalidInput(
            "souq-lease-nonce and fly-machine-lease-nonce name different nonces",
            hint="send the lease's nonce in one of them",
        )
    return souq or fly


# The lease nonce: a leased machine changes only for the lease's holder.
LeaseNonce = Annotated[str | None, Depends(lease_nonce)]
