"""The routes made from the operations' declarations (:mod:`souq.operations`): one per
operation whose route is ``made``. Each reads the machine's app and id from its path, the
lease's nonce from its header when the operation is leased, and its body when it takes one;
sends the operation's verb to the machine's worker with those (and the declaration's fixed
fields); and answers the worker's reply as it came (a machine's record is the broker's view's
at once)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from souq.broker.bodies import AppName, LeaseNonce, body_schema, parse_body
from souq.broker.service import BrokerService
from souq.model import Machine
from souq.operations import OPERATIONS, Operation, body_type, resolve
from souq.protocol.verbs import VERBS

__all__ = ["operations_router"]

Endpoint = Callable[..., Awaitable[Response]]


def operations_router(service: BrokerService) -> APIRouter:
    router = APIRouter(tags=["machines"])
    for op in OPERATIONS:
        if op.route != "made":
            continue
        body = body_type(op)
        router.add_api_route(
            op.route_path,
            _endpoint(service, op),
            methods=[op.method],
            name=op.name,
            description=op.summary,
            response_model=resolve(op.answer or op.reply),
            status_code=op.status_code,
            openapi_extra=None if body is None else body_schema(body),
        )
    return router


def _endpoint(service: BrokerService, op: Operation) -> Endpoint:
    verb = VERBS[op.verb]
    body_model = body_type(op)

    async def call(app: str, machine_id: str, request: Request, nonce: str | None) -> Response:
        fields: dict[str, Any] = {"app": app, "machine_id": machine_id, **op.fixed}
        if op.leased:
            fields["lease_nonce"] = nonce
        if body_model is not None:
            fields.update((await parse_body(request, body_model)).model_dump())
        reply = await service.calls.owner(machine_id, verb, verb.request(**fields))
        if isinstance(reply, Machine):
            service.view.apply(reply)  # read-your-writes on this broker
        if op.status_code == 204:
            return Response(status_code=204)
        return Response(verb.reply_adapter.dump_json(reply), media_type="application/json")

    if op.leased:

        async def leased(
            app: AppName, machine_id: str, request: Request, nonce: LeaseNonce = None
        ) -> Response:
            return await call(app, machine_id, request, nonce)

        return leased

    async def plain(app: AppName, machine_id: str, request: Request) -> Response:
        return await call(app, machine_id, request, None)

    return plain
