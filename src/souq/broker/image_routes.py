"""The image routes: ``POST /v1/images`` stores an image (its OCI layout, as a tar, is the body),
``GET /v1/images`` lists them and ``GET /v1/images/{ref}`` shows one, by reference (``sha256:…``) or
name (a registry's name too, slashes and all: ``docker.io/library/busybox``). The store is
JetStream's (:mod:`souq.images.store`), opened on first use (:mod:`souq.broker.images`): a broker
over a NATS without JetStream still serves everything else.

Whose: a token of one app stores names in that app's namespace and sees that app's names and
the cluster's; a token of every app stores the cluster's names, or one app's with ``?app=``
(:mod:`souq.images.store` says who may run what).

An upload is never held in memory: its body is written, as it arrives, to a temporary file
(unnamed: gone when closed, or when the broker dies), then each layer is read from there through
its checks and into the object store in chunks. A token may have :data:`UPLOADS_PER_TOKEN`
uploads under way at once, a broker :data:`UPLOADS_TOTAL` (429 ``too_many_requests`` past
either, before the body is read).
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import IO, Annotated, Any

from fastapi import APIRouter, Query, Request

from souq.auth.tokens import ALL_APPS
from souq.broker.cluster_routes import client_address
from souq.broker.service import BrokerService
from souq.broker.streams import StreamSlots
from souq.errors import Forbidden, InvalidInput, PayloadTooLarge, Unavailable
from souq.images.names import image_name
from souq.images.oci import read_layout_file
from souq.images.store import CLUSTER
from souq.limits import (
    BODY_IMAGE_BYTES,
    UPLOADS_PER_TOKEN,
    UPLOADS_TOTAL,
    dns_label_problem,
    size_text,
)
from souq.model.image import ImageRecord

__all__ = ["MAX_IMAGE_BYTES", "images_router"]

MAX_IMAGE_BYTES = BODY_IMAGE_BYTES  # refused before it is read whole (souq.http_limits too)
_SPOOL_WRITE = 1 << 20  # the body goes to its file in writes of about this much

AppQuery = Annotated[
    str | None,
    Query(
        description="whose names: this app's (a token of every app may name any app; an app's "
        "token is its own app's whatever it says)"
    ),
]


def images_router(service: BrokerService) -> APIRouter:
    router = APIRouter(tags=["images"])
    store = service.images.store
    uploads = StreamSlots(
        per_client=UPLOADS_PER_TOKEN,
        total=UPLOADS_TOTAL,
        what="image uploads under way",
        hint=_BUSY,
    )

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
        app: AppQuery = None,
    ) -> ImageRecord:
        """Store an image: the body is its OCI image layout as a tar (`souq image build` and
        `souq image import` send one). Every blob is checked against its digest, and every
        layer's entries (nothing outside the root, no device files)."""
        owner = _owner(request, app)
        if name is not None:
            _may_name(request, name, owner)
        client = client_address(request)
        uploads.take(client)  # 429 past the uploads one token may have under way
        try:
            with tempfile.TemporaryFile(prefix="souq-upload-") as spool:
                try:
                    await _spool_body(request, spool)
                except OSError as exc:  # the broker's temporary directory: full, or gone
                    raise Unavailable(
                        f"this broker could not keep the upload on its disk: {exc}",
                        hint="retry through another broker, or free room in its temporary "
                        "directory (TMPDIR)",
                    ) from exc
                layout = await asyncio.to_thread(read_layout_file, spool)
                return await (await store()).put(
                    layout.image, name=name, owner=owner, open_blob=layout.open_blob
                )
        finally:
            uploads.release(client)

    @router.get("/v1/images", response_model=list[ImageRecord])
    async def list_images(request: Request, app: AppQuery = None) -> list[ImageRecord]:
        return await (await store()).list(app=_owner(request, app))

    @router.get("/v1/images/{ref:path}", response_model=ImageRecord)
    async def get_image(request: Request, ref: str, app: AppQuery = None) -> ImageRecord:
        return await (await store()).record(ref, app=_owner(request, app))

    return router


_BUSY = "wait for an upload of this token to end, or retry later"


def _owner(request: Request, app: str | None) -> str | None:
    """Whose names a request reads and writes: an app token's app; for a token of every app
    (or a broker without tokens), ``app`` if given, else the cluster's."""
    problem = None if app is None else dns_label_problem("app", app)
    if problem is not None:
        raise InvalidInput(problem, hint="name an app: a DNS label", details={"field": "app"})
    grant: Any = request.scope.get("state", {}).get("grant")
    if grant is None or grant.app == ALL_APPS:
        return app or CLUSTER
    if app is not None and app != grant.app:
        raise Forbidden(
            f"this token is for app {grant.app}: it may not read or store app {app}'s images",
            hint=f"leave out app, or give {grant.app}",
            details={"field": "app"},
        )
    return str(grant.app)


def _may_name(request: Request, name: str, owner: str | None) -> None:
    """A name written with its registry stands in for that registry's image for every app of
    the cluster: only a token of every app (an operator's) may store one, and as the
    cluster's. An app's token stores short names, in its app's namespace."""
    if not image_name(name, field="name").registry_given:
        return
    grant: Any = request.scope.get("state", {}).get("grant")
    if grant is not None and grant.app != ALL_APPS:
        raise Forbidden(
            f"this token is for app {grant.app}: it may not store an image under a registry's "
            f"name ({name}), which every app's machines would run",
            hint="store it under a short name (NAME:TAG), or use a token of every app",
            details={"field": "name"},
        )
    if owner is not CLUSTER:
        raise InvalidInput(
            f"name: a registry's name ({name}) is the cluster's, not app {owner}'s",
            hint="leave out app to store it as the cluster's, or give a short name",
            details={"field": "name"},
        )


async def _spool_body(request: Request, spool: IO[bytes]) -> None:
    """The body into ``spool`` as it arrives (413 past the limit, 422 when empty)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_IMAGE_BYTES:
        raise _too_large()
    size = 0
    pending = bytearray()
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_IMAGE_BYTES:
            raise _too_large()
        pending += chunk
        if len(pending) >= _SPOOL_WRITE:
            await asyncio.to_thread(spool.write, bytes(pending))
            pending.clear()
    if pending:
        await asyncio.to_thread(spool.write, bytes(pending))
    if not size:
        raise InvalidInput(
            "the body is empty: it must be an OCI image layout as a tar",
            hint="use `souq image build DIR` or `souq image import PATH`",
        )
    await asyncio.to_thread(spool.flush)
    spool.seek(0)


def _too_large() -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the image is larger than {size_text(MAX_IMAGE_BYTES)}, the limit of POST /v1/images",
        hint="make the image smaller, e.g. leave build outputs and caches out of the directory",
    )
