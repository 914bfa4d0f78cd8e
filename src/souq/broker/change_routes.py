"""The routes that change a machine in place: ``POST /v1/apps/{app}/machines/{id}`` replaces its
config (it keeps its worker and gets a new ``instance_id``), and ``.../lease`` takes, shows and ends
the machine's lease (:mod:`souq.agent.machines.leases`): while one lasts, every change needs its
nonce in the ``souq-lease-nonce`` header (or Fly's ``fly-machine-lease-nonce``). A lease is answered
in Souq's form and Fly's at once: Souq's fields, and Fly's ``{"status", "data": {"nonce",
"expires_at" (seconds), "owner", "version"}}``. A signal's route is made from its declaration
(:mod:`souq.operations`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from souq.auth.access import permit_of
from souq.broker.bodies import MACHINE, AppName, LeaseNonce, body_schema, json_response, parse_body
from souq.broker.schemas import LeaseBody, UpdateMachineRequest
from souq.broker.secret_routes import skips_secrets
from souq.broker.service import BrokerService
from souq.model import Machine
from souq.model.protocol import Lease, LeaseRequest

__all__ = ["changes_router"]


def lease_response(lease: Lease) -> Response:
    """The lease in Souq's form and Fly's (``status`` and ``data``) in one object."""
    fly = {
        "status": "success",
        "data": {
            "nonce": lease.nonce,
            "expires_at": lease.expires_at // 1000,
            "owner": lease.description,
            "version": str(lease.version),
        },
    }
    return JSONResponse({**lease.model_dump(mode="json"), **fly})


def changes_router(service: BrokerService) -> APIRouter:
    router = APIRouter(tags=["machines"])

    @router.post(
        MACHINE,
        response_model=Machine,
        openapi_extra=body_schema(UpdateMachineRequest),
    )
    async def update_machine(
        app: AppName, machine_id: str, request: Request, nonce: LeaseNonce = None
    ) -> Response:
        """Replace the machine's config; it keeps its worker and gets a new `instance_id`. A
        started machine is stopped (its stop config) and started with the new config; the
        answer comes once it has."""
        body = await parse_body(request, UpdateMachineRequest)
        machine = await service.update_machine(
            app,
            machine_id,
            body.config,
            skip_launch=body.skip_launch,
            skip_secrets=skips_secrets(
                permit_of(request.scope.get("state")), app, asked=body.skip_secrets
            ),
            min_secrets_version=max(body.min_secrets_version or 0, service.secrets_version),
            nonce=nonce,
        )
        if body.lease_ttl is None:
            return json_response(machine)
        # Fly's lease_ttl: the machine stays (or is made) leased; the nonce is in the answer.
        lease = await service.take_lease(
            LeaseRequest(
                app=app, machine_id=machine_id, lease_nonce=nonce, ttl_s=float(body.lease_ttl)
            )
        )
        return json_response(machine, extra={"nonce": lease.nonce})

    @router.post(MACHINE + "/lease", response_model=Lease, openapi_extra=body_schema(LeaseBody))
    async def take_lease(
        app: AppName,
        machine_id: str,
        request: Request,
        nonce: LeaseNonce = None,
        ttl: Annotated[int | None, Query(ge=1, le=3600, description="Fly's: seconds")] = None,
    ) -> Response:
        """Lease the machine for `ttl` seconds (the body's, or the query's as Fly sends it;
        default 30); with the lease's nonce, extend it. `409 lease_held` while another lease
        lasts."""
        body = await parse_body(request, LeaseBody, optional=True)
        req = LeaseRequest(
            app=app,
            machine_id=machine_id,
            lease_nonce=nonce,
            ttl_s=float(ttl) if ttl is not None else body.ttl,
            description=body.description,
        )
        return lease_response(await service.take_lease(req))

    @router.get(MACHINE + "/lease", response_model=Lease)
    async def show_lease(app: AppName, machine_id: str) -> Response:
        """The machine's live lease; `404 not_found` when it has none."""
        return lease_response(await service.lease(app, machine_id))

    @router.delete(MACHINE + "/lease", response_model=Lease)
    async def end_lease(app: AppName, machine_id: str, nonce: LeaseNonce = None) -> Response:
        """End the lease (its nonce in `souq-lease-nonce` or `fly-machine-lease-nonce`)."""
        return lease_response(await service.release_lease(app, machine_id, nonce))

    return router
