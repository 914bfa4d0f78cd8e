"""OCI image descriptors, manifests and configs: the types, and the checks that parse them.

An image is a manifest (schemaVersion 2) naming one config blob and its layer blobs by
descriptor (media type, digest, size); the manifest's digest is the image's reference. Docker's
schema-2 media types are accepted wherever the OCI ones are. Every blob parsed here is checked
against its descriptor's size and digest first.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from souq.errors import ImageInvalid
from souq.images.layers import LAYER_MEDIA_TYPES
from souq.model.image import ImageLayer, ImageRecord, ImageRun

__all__ = [
    "CONFIG_TYPES",
    "INDEX_TYPES",
    "MANIFEST_TYPES",
    "MEDIA_CONFIG",
    "MEDIA_INDEX",
    "MEDIA_MANIFEST",
    "REF_NAME",
    "Descriptor",
    "Image",
    "RunConfig",
    "check_digest",
    "dumps",
    "host_architecture",
    "image_from_manifest",
    "parse_json",
    "record_of",
    "verify_blob",
    "verify_descriptor",
]

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
MANIFEST_TYPES = frozenset({MEDIA_MANIFEST, "application/vnd.docker.distribution.manifest.v2+json"})
CONFIG_TYPES = frozenset({MEDIA_CONFIG, "application/vnd.docker.container.image.v1+json"})
INDEX_TYPES = frozenset({MEDIA_INDEX, "application/vnd.docker.distribution.manifest.list.v2+json"})
_DIGEST = re.compile(r"(sha256):([a-f0-9]{64})|(sha512):([a-f0-9]{128})")
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386", "i386": "386"}
_HINT_CORRUPT = "the layout is corrupt or was changed after it was written; export it again"


@dataclass(frozen=True)
class Descriptor:
    """A content descriptor: what a blob is, its digest (``sha256:<hex>``) and its size."""

    media_type: str
    digest: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}

    @classmethod
    def of(cls, media_type: str, data: bytes) -> Descriptor:
        return cls(media_type, "sha256:" + hashlib.sha256(data).hexdigest(), len(data))

    @classmethod
    def from_json(cls, raw: object, where: str) -> Descriptor:
        if not isinstance(raw, dict):
            raise ImageInvalid(f"{where}: a descriptor must be an object, not {raw!r}")
        media_type, digest, size = raw.get("mediaType"), raw.get("digest"), raw.get("size")
        if not isinstance(media_type, str) or not isinstance(digest, str):
            raise ImageInvalid(f"{where}: a descriptor needs a string mediaType and digest")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ImageInvalid(f"{where}: descriptor {digest} needs a size in bytes, not {size!r}")
        check_digest(digest)
        return cls(media_type, digest, size)


@dataclass(frozen=True)
class RunConfig:
    """What the image says to run: ``Entrypoint + Cmd`` (as Docker joins them), its environment
    and its working directory ("" when unset)."""

    cmd: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = ""
    entrypoint: tuple[str, ...] = ()  # the two halves of ``cmd``, for a machine that
    args: tuple[str, ...] = ()  # replaces one of them (Fly's init.entrypoint / init.cmd)


@dataclass(frozen=True)
class Image:
    """One image: its manifest's descriptor (the reference), its config and layers, what it runs,
    and the bytes of every blob it is made of."""

    manifest: Descriptor
    config: Descriptor
    layers: tuple[Descriptor, ...]
    run: RunConfig
    blobs: Mapping[str, bytes] = field(compare=False, repr=False)
    name: str | None = None

    @property
    def reference(self) -> str:
        return self.manifest.digest

    @property
    def layers_size(self) -> int:
        return sum(layer.size for layer in self.layers)


def host_architecture() -> str:
    """This host's architecture as OCI (Go's GOARCH) spells it: ``amd64``, ``arm64``, …"""
    machine = platform.machine().lower()
    return _ARCH.get(machine, machine)


def check_digest(digest: str) -> re.Match[str]:
    """``digest`` parsed (a sha256 or sha512 digest in lowercase hex), or refused: a digest
    becomes a blob's path, so nothing else may pass."""
    match = _DIGEST.fullmatch(digest)
    if match is None:
        raise ImageInvalid(
            f"digest {digest!r} is not a sha256 or sha512 digest",
            hint="a digest reads 'sha256:' and 64 lowercase hex digits",
        )
    return match


def verify_blob(digest: str, data: bytes) -> None:
    """Raise :class:`ImageInvalid` unless ``data`` hashes to ``digest``."""
    match = check_digest(digest)
    algorithm = match.group(1) or match.group(3)
    actual = f"{algorithm}:{hashlib.new(algorithm, data).hexdigest()}"
    if actual != digest:
        raise ImageInvalid(
            f"blob {digest} does not match its digest: its content hashes to {actual}",
            hint=_HINT_CORRUPT,
        )


def verify_descriptor(descriptor: Descriptor, data: bytes) -> None:
    """Raise :class:`ImageInvalid` unless ``data`` has the descriptor's size and digest."""
    if len(data) != descriptor.size:
        raise ImageInvalid(
            f"blob {descriptor.digest} is {len(data)} bytes but its descriptor says "
            f"{descriptor.size}",
            hint=_HINT_CORRUPT,
        )
    verify_blob(descriptor.digest, data)


def parse_json(data: bytes, what: str) -> dict[str, Any]:
    """A JSON object from ``data``, or :class:`ImageInvalid` naming ``what`` it was."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ImageInvalid(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ImageInvalid(f"{what} must be a JSON object")
    return value


def dumps(value: object) -> bytes:
    """Compact JSON with sorted keys: the same value always gives the same bytes (digest)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _strings(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ImageInvalid(f"image config {what} must be a list of strings, not {value!r}")
    return tuple(value)


def _run_config(config: dict[str, Any]) -> RunConfig:
    run = config.get("config") or {}
    if not isinstance(run, dict):
        raise ImageInvalid("image config 'config' must be an object")
    entrypoint = _strings(run.get("Entrypoint"), "Entrypoint")
    args = _strings(run.get("Cmd"), "Cmd")
    env = tuple(
        (key, value)
        for key, _, value in (e.partition("=") for e in _strings(run.get("Env"), "Env"))
    )
    workdir = run.get("WorkingDir") or ""
    if not isinstance(workdir, str):
        raise ImageInvalid(f"image config WorkingDir must be a string, not {workdir!r}")
    return RunConfig(entrypoint + args, env, workdir, entrypoint, args)


def image_from_manifest(
    manifest: Descriptor,
    fetch: Callable[[Descriptor], bytes],
    name: str | None,
    *,
    layers: bool = True,
) -> Image:
    """Parse the manifest ``manifest`` (fetching and verifying its blobs) into an :class:`Image`;
    ``layers=False``: its manifest and config only (the layers are fetched where they run)."""
    what = f"manifest {manifest.digest}"
    if manifest.media_type not in MANIFEST_TYPES:
        raise ImageInvalid(
            f"{what} has media type {manifest.media_type!r}, not an image manifest",
            hint=f"use {MEDIA_MANIFEST}",
        )
    blobs = {manifest.digest: fetch(manifest)}
    body = parse_json(blobs[manifest.digest], what)
    if body.get("schemaVersion") != 2:
        raise ImageInvalid(f"{what} has schemaVersion {body.get('schemaVersion')!r}, not 2")
    if body.get("mediaType", manifest.media_type) != manifest.media_type:
        raise ImageInvalid(f"{what} says mediaType {body['mediaType']!r}, its descriptor another")
    config = Descriptor.from_json(body.get("config"), f"{what} config")
    if config.media_type not in CONFIG_TYPES:
        raise ImageInvalid(
            f"{what}: config media type {config.media_type!r} is not an image config",
            hint=f"use {MEDIA_CONFIG}",
        )
    raw_layers = body.get("layers")
    if not isinstance(raw_layers, list):
        raise ImageInvalid(f"{what} needs a 'layers' list")
    described = tuple(Descriptor.from_json(raw, f"{what} layer") for raw in raw_layers)
    for layer in described:
        if layer.media_type not in LAYER_MEDIA_TYPES:
            raise ImageInvalid(
                f"{what}: layer {layer.digest} has media type {layer.media_type!r}",
                hint=f"supported layer media types: {', '.join(sorted(LAYER_MEDIA_TYPES))}",
            )
    blobs[config.digest] = fetch(config)
    parsed = parse_json(blobs[config.digest], f"image config {config.digest}")
    rootfs = parsed.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list) or len(diff_ids) != len(described):
        raise ImageInvalid(
            f"image config {config.digest} must list one rootfs.diff_ids entry per layer "
            f"({len(described)})"
        )
    for layer in described if layers else ():
        blobs[layer.digest] = fetch(layer)
    return Image(manifest, config, described, _run_config(parsed), blobs, name)


def record_of(image: Image, *, name: str | None = None, created_at: str = "") -> ImageRecord:
    """What the cluster keeps of ``image``: its reference, layers and run config."""
    return ImageRecord(
        reference=image.reference,
        name=name,
        size=image.layers_size,
        config_digest=image.config.digest,
        layers=[
            ImageLayer(digest=d.digest, size=d.size, media_type=d.media_type) for d in image.layers
        ],
        run=ImageRun(
            cmd=list(image.run.cmd),
            env=dict(image.run.env),
            workdir=image.run.workdir,
            entrypoint=list(image.run.entrypoint),
            args=list(image.run.args),
        ),
        created_at=created_at,
    )
