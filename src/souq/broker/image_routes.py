"""The image routes: ``POST /v1/images`` stores an image (its OCI layout, as a tar, is the body),
``GET /v1/images`` lists them and ``GET /v1/images/{ref}`` shows one, by reference (``sha256:…``) or
name (a registry's name too, slashes and all: ``docker.io/library/busybox``). The store is
JetStream's (:mod:`souq.images.store`), opened on first use (:mod:`souq.broker.images`): a broker
over a NATS without JetStream still serves everything else."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from souq.auth.tokens import ALL_APPS
from souq.broker.service import BrokerService
from souq.errors import Forbidden, InvalidInput, PayloadTooLarge
from souq.images import read_layout_bytes
from souq.images.names import image_name
from souq.limits import BODY_IMAGE_BYTES, size_text
from souq.model.image import ImageRecord

__all__ = ["MAX_IMAGE_BYTES", "images_router"]

MAX_IMAGE_BYTES = BODY_IMAGE_BYTES  # refused before it is read whole (souq.http_limits too)


def images_router(service: BrokerService) -> APIRouter:
    router = APIRouter(tags=["images"])
    store = service.images.store

    @router.post("/v1/images", status_code=201, response_model=ImageRecord)
    async def push_image(
        request: Request,
        name: Annotated[
            str | None,
            Query(
                description="a name to store it under: NAME[:TAG], or a registry's name "
                "(docker.io/library/busybox:latest), kept in Docker's normal form"
            ),
        ] = None,
    ) -> ImageRecord:
        """Store an image: the body is its OCI image layout as a tar (`souq image build` and
        `souq image import` send one). Every blob is checked against its digest."""
        if name is not None:
            _may_name(request, name)
        data = await _read_body(request)
        image = await asyncio.to_thread(read_layout_bytes, data)
        return await (await store()).put(image, name=name)

    @router.get("/v1/images", response_model=list[ImageRecord])
    async def list_images() -> list[ImageRecord]:
        return await (await store()).list()

    @router.get("/v1/images/{ref:path}", response_model=ImageRecord)
    async def get_image(ref: str) -> ImageRecord:
        return await (await store()).record(ref)

    return router


def _may_name(request: Request, name: str) -> None:
    """A name written with its registry stands in for that registry's image for every app of
    the cluster: only a token of every app (an operator's) may store one. An app's token
    stores short names, as before."""
    grant: Any = request.scope.get("state", {}).get("grant")
    if grant is None or grant.app == ALL_APPS:
        return
    if image_name(name, field="name").registry_given:
        raise Forbidden(
            f"this token is for app {grant.app}: it may not store an image under a registry's "
            f"name ({name}), which every app's machines would run",
            hint="store it under a short name (NAME:TAG), or use a token of every app",
            details={"field": "name"},
        )


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_IMAGE_BYTES:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_IMAGE_BYTES:
            raise _too_large()
        chunks.append(chunk)
    if not size:
        raise InvalidInput(
            "the body is empty: it must be an OCI image layout as a tar",
            hint="use `souq image build DIR` or `souq image import PATH`",
        )
    return b"".join(chunks)


def _too_large() -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the image is larger than {size_text(MAX_IMAGE_BYTES)}, the limit of POST /v1/images",
        hint="make the image smaller, e.g. leave build outputs and caches out of the directory",
    )
