"""Fly's volume routes (``/v1/apps/{app}/volumes``, shapes in docs/fly-compat.md section 2):

* ``GET|POST /v1/apps/{app}/volumes`` — list the app's live volumes; create one (fly-go's
  ``CreateVolumeRequest``; 200 with the volume, placed on a worker of its region with the disk);
* ``GET|PUT|DELETE /v1/apps/{app}/volumes/{id}`` — one volume; its settings; destroy it
  (answers the volume, ``destroyed``; refused with ``volume_attached`` while a machine has it);
* ``PUT …/{id}/extend`` ``{"size_gb"}`` — ``{"volume", "needs_restart": false}``;
* ``GET|POST …/{id}/snapshots`` — its snapshots; take one (an archive kept on its worker).

Reads need the app's ``read`` scope, the rest its ``write`` (``souq.auth.routes``); every
mutating call is audited like any other. The use cases are :mod:`souq.broker.volumes`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from souq.broker.bodies import AppName, body_schema, json_response, parse_body
from souq.broker.service import BrokerService
from souq.model.volume import (
    CreateVolumeRequest,
    ExtendVolumeRequest,
    ExtendVolumeResponse,
    UpdateVolumeRequest,
    Volume,
    VolumeSnapshot,
)

__all__ = ["volumes_router"]

VOLUMES = "/v1/apps/{app}/volumes"
VOLUME = VOLUMES + "/{volume_id}"


def volumes_router(service: BrokerService) -> APIRouter:
    router = APIRouter(tags=["volumes"])
    volumes = service.volumes

    @router.get(VOLUMES, response_model=list[Volume])
    async def list_volumes(app: AppName) -> Response:
        """The app's volumes on every worker (destroyed ones left out), oldest first."""
        return json_response(await volumes.list_volumes(app))

    @router.post(VOLUMES, response_model=Volume, openapi_extra=body_schema(CreateVolumeRequest))
    async def create_volume(app: AppName, request: Request) -> Response:
        """Place a volume on a worker of the region with the disk for it (size_gb: 1 unless
        given)."""
        body = await parse_body(request, CreateVolumeRequest)
        return json_response(await volumes.create(app, body))

    @router.get(VOLUME, response_model=Volume)
    async def get_volume(app: AppName, volume_id: str) -> Response:
        return json_response(await volumes.get(app, volume_id))

    @router.put(VOLUME, response_model=Volume, openapi_extra=body_schema(UpdateVolumeRequest))
    async def update_volume(app: AppName, volume_id: str, request: Request) -> Response:
        body = await parse_body(request, UpdateVolumeRequest, optional=True)
        return json_response(await volumes.update(app, volume_id, body))

    @router.delete(VOLUME, response_model=Volume)
    async def destroy_volume(app: AppName, volume_id: str) -> Response:
        """Destroy a volume no machine has attached: its files and snapshots go."""
        return json_response(await volumes.destroy(app, volume_id))

    @router.put(
        VOLUME + "/extend",
        response_model=ExtendVolumeResponse,
        openapi_extra=body_schema(ExtendVolumeRequest),
    )
    async def extend_volume(app: AppName, volume_id: str, request: Request) -> Response:
        body = await parse_body(request, ExtendVolumeRequest)
        return json_response(await volumes.extend(app, volume_id, body.size_gb))

    @router.get(VOLUME + "/snapshots", response_model=list[VolumeSnapshot])
    async def list_snapshots(app: AppName, volume_id: str) -> Response:
        return json_response(await volumes.snapshots(app, volume_id))

    @router.post(VOLUME + "/snapshots", response_model=VolumeSnapshot)
    async def create_snapshot(app: AppName, volume_id: str) -> Response:
        """Archive the volume's files now (kept on its worker until the volume goes)."""
        return json_response(await volumes.snapshot(app, volume_id))

    return router
