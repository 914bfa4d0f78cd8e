"""An image as the cluster knows it: its reference, name, layers and what it runs."""

from __future__ import annotations

from pydantic import Field

from souq.model.base import Record

__all__ = ["ImageLayer", "ImageRecord", "ImageRun"]


class ImageLayer(Record):
    digest: str = Field(description="sha256:… of the layer as stored (compressed)")
    size: int = Field(description="bytes")
    media_type: str


class ImageRun(Record):
    cmd: list[str] = Field(default_factory=list, description="the image's entrypoint and command")
    entrypoint: list[str] = Field(default_factory=list, description="the first part of `cmd`")
    args: list[str] = Field(default_factory=list, description="the rest: the image's command")
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str = ""


class ImageRecord(Record):
    reference: str = Field(description="sha256:… of the image's manifest: what `image` names")
    name: str | None = Field(default=None, description="a name it was stored under, if any")
    size: int = Field(description="bytes of all its layers, as pulled")
    config_digest: str
    layers: list[ImageLayer]
    run: ImageRun
    created_at: str
    source: str | None = Field(
        default=None,
        description="the OCI registry reference its layers are pulled from by each worker "
        "(HOST[:PORT]/REPO@sha256:…); none: the cluster's store",
    )
