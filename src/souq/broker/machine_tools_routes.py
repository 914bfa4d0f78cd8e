"""The routes that act on a machine in place, in the shapes of Fly's Machines API (what Fly's
Go client ``flaps`` sends and decodes; docs/fly-compat.md):

========================================  =============================================
route (under ``/v1/apps/{app}/machines``)  answer
========================================  =============================================
``POST {id}/exec``                         ``{exit_code, stdout, stderr}``
``GET {id}/metadata``                      ``{key: value}``
``POST {id}/metadata/{key}``               ``204`` (body ``{"value": STRING}``)
``DELETE {id}/metadata/{key}``             ``204``
========================================  =============================================

Each is one verb to the machine's worker (:mod:`souq.agent.machines.tools` answers); none
restarts the machine. ``ps``, ``cordon`` and ``uncordon`` are made from their declarations
(:mod:`souq.broker.op_routes`). An exec's bus request is given its ``timeout`` on top of the command
timeout, so the worker's ``408 timeout`` reaches the caller before the bus gives up.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from souq.broker.bodies import (
    MACHINE,
    AppName,
    body_schema,
    json_response,
    parse_body,
)
from souq.broker.service import BrokerService
from souq.errors import InvalidInput
from souq.model.machine_tools import (
    ExecBody,
    ExecCommand,
    ExecReply,
    MetadataBody,
    MetadataCommand,
)
from souq.protocol import verbs as v

__all__ = ["machine_tools_router"]


def machine_tools_router(service: BrokerService) -> APIRouter:
    router = APIRouter(tags=["machines"])

    @router.post(MACHINE + "/exec", response_model=ExecReply, openapi_extra=body_schema(ExecBody))
    async def exec_in_machine(app: AppName, machine_id: str, request: Request) -> Response:
        """Run a command in a started machine's context (its env, directory, user, cgroup):
        Fly's `cmd` (one string, split like a shell) or `command` (argv); `stdin`; `timeout`
        in seconds (default 30, at most 300). Output is kept up to 256 KiB per stream.
        `408 timeout` when it runs longer (it is killed); `409 machine_not_started`."""
        body = await parse_body(request, ExecBody)
        cmd = ExecCommand(
            app=app,
            machine_id=machine_id,
            argv=body.argv(),
            stdin=body.stdin,
            timeout_s=body.timeout_s(),
        )
        reply = await service.calls.owner(machine_id, v.EXEC, cmd, extra_s=cmd.timeout_s)
        return json_response(reply)

    @router.get(MACHINE + "/metadata", response_model=dict[str, str])
    async def get_metadata(app: AppName, machine_id: str) -> Response:
        """The machine's `config.metadata`, as a map."""
        machine = await service.get_machine(app, machine_id)
        return JSONResponse(machine.config.metadata)

    @router.post(
        MACHINE + "/metadata/{key}", status_code=204, openapi_extra=body_schema(MetadataBody)
    )
    async def set_metadata(app: AppName, machine_id: str, key: str, request: Request) -> Response:
        """Set one key of the machine's metadata (durable on its worker; no restart, the same
        `instance_id`)."""
        body = await parse_body(request, MetadataBody)
        await _metadata(service, app, machine_id, key, body.value)
        return Response(status_code=204)

    @router.delete(MACHINE + "/metadata/{key}", status_code=204)
    async def delete_metadata(app: AppName, machine_id: str, key: str) -> Response:
        """Delete one key of the machine's metadata (a key it does not have: nothing changes)."""
        await _metadata(service, app, machine_id, key, None)
        return Response(status_code=204)

    return router


async def _metadata(
    service: BrokerService, app: str, machine_id: str, key: str, value: str | None
) -> dict[str, str]:
    try:
        cmd = MetadataCommand(app=app, machine_id=machine_id, key=key, value=value)
    except ValueError:
        raise InvalidInput(
            f"metadata key {key[:32]!r}: 1 to 128 characters", details={"field": "key"}
        ) from None
    return await service.calls.owner(machine_id, v.METADATA, cmd)
