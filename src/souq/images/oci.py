"""OCI images: pack a directory into one, and write and read the OCI image layout.

Follows the OCI image-spec (v1.1) and its image layout: an ``oci-layout`` file
(``{"imageLayoutVersion": "1.0.0"}``), an ``index.json`` (an image index) and content-addressed
blobs under ``blobs/<algorithm>/<hex>``. Reading also accepts Docker's schema-2 media types,
uncompressed layers, and an index that points to another index (followed one level, preferring
this host's platform). The types live in :mod:`souq.images.manifest` and layer tars in
:mod:`souq.images.layers`; both are re-exported here.
"""

from __future__ import annotations

import gzip
import io
import posixpath
import tarfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from souq.errors import ImageInvalid, ImageNotFound
from souq.images.layers import MEDIA_LAYER_GZIP, pack_layer, unpack_layer
from souq.images.manifest import (
    INDEX_TYPES,
    MEDIA_CONFIG,
    MEDIA_INDEX,
    MEDIA_MANIFEST,
    REF_NAME,
    Descriptor,
    Image,
    RunConfig,
    check_digest,
    dumps,
    host_architecture,
    image_from_manifest,
    parse_json,
    verify_blob,
    verify_descriptor,
)

__all__ = [
    "Descriptor",
    "Image",
    "LayoutFile",
    "RunConfig",
    "choose_entry",
    "layout_tar",
    "pack_directory",
    "read_layout",
    "read_layout_bytes",
    "read_layout_file",
    "unpack_layer",
    "verify_blob",
    "write_layout",
]

_LAYOUT_VERSION = "1.0.0"


def pack_directory(
    path: Path,
    *,
    cmd: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    workdir: str = "/",
    name: str | None = None,
) -> Image:
    """An image of one deterministic gzip layer holding the directory's files: the same
    directory (and arguments) gives the same reference every time on a host architecture."""
    if not path.is_dir():
        raise ImageInvalid(f"{path} is not a directory", hint="pack a directory of files")
    for key in env or {}:
        if not key or "=" in key:
            raise ImageInvalid(f"environment variable name {key!r} is empty or holds '='")
    layer = pack_layer(path)
    run: dict[str, Any] = {"WorkingDir": workdir}
    if cmd:
        run["Cmd"] = list(cmd)
    if env:
        run["Env"] = [f"{k}={v}" for k, v in sorted(env.items())]
    config = {
        "architecture": host_architecture(),
        "os": "linux",
        "config": run,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id]},
    }
    config_bytes = dumps(config)
    config_desc = Descriptor.of(MEDIA_CONFIG, config_bytes)
    layer_desc = Descriptor.of(MEDIA_LAYER_GZIP, layer.data)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config_desc.to_json(),
        "layers": [layer_desc.to_json()],
    }
    manifest_bytes = dumps(manifest)
    blobs = {
        config_desc.digest: config_bytes,
        layer_desc.digest: layer.data,
        (manifest_desc := Descriptor.of(MEDIA_MANIFEST, manifest_bytes)).digest: manifest_bytes,
    }
    return image_from_manifest(manifest_desc, lambda d: blobs[d.digest], name)


# -- the layout -----------------------------------------------------------------------------


def _blob_path(digest: str) -> str:
    algorithm, _, encoded = check_digest(digest).group(0).partition(":")
    return f"blobs/{algorithm}/{encoded}"


def _layout_files(image: Image) -> list[tuple[str, bytes]]:
    entry = image.manifest.to_json()
    if image.name:
        entry["annotations"] = {REF_NAME: image.name}
    index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [entry]}
    files = [
        ("oci-layout", dumps({"imageLayoutVersion": _LAYOUT_VERSION})),
        ("index.json", dumps(index)),
    ]
    digests = [image.manifest.digest, image.config.digest, *(d.digest for d in image.layers)]
    files += sorted({_blob_path(d): image.blobs[d] for d in digests}.items())
    return files


def layout_tar(image: Image) -> bytes:
    """The OCI image layout of ``image`` as one uncompressed tar (deterministic bytes)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        made: set[str] = set()
        for path, data in _layout_files(image):
            parts = path.split("/")
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth])
                if directory not in made:
                    made.add(directory)
                    info = tarfile.TarInfo(directory)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                    tar.addfile(info)
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def write_layout(image: Image, dest: Path) -> None:
    """Write ``image`` as an OCI image layout directory at ``dest`` (its ``index.json`` then
    lists this image alone)."""
    for path, data in _layout_files(image):
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _load(
    read: Callable[[str], bytes | None], where: str, name: str | None, *, layers: bool = True
) -> Image:
    """An image from a layout whose files ``read`` returns (``None`` when missing); with
    ``layers=False`` its layers' bytes are not read (nor checked: the caller does)."""
    layout = read("oci-layout")
    if layout is None:
        raise ImageInvalid(
            f"{where} is not an OCI image layout: it has no oci-layout file",
            hint="give a directory (or tar) written in the OCI image layout, e.g. by "
            "'skopeo copy ... oci:DIR' or 'docker save'",
        )
    version = parse_json(layout, f"{where}/oci-layout").get("imageLayoutVersion")
    if not isinstance(version, str) or not version.startswith("1."):
        raise ImageInvalid(f"{where}: imageLayoutVersion {version!r} is not supported (1.x is)")
    index_bytes = read("index.json")
    if index_bytes is None:
        raise ImageInvalid(f"{where} is not an OCI image layout: it has no index.json")

    def fetch(descriptor: Descriptor) -> bytes:
        data = read(_blob_path(descriptor.digest))
        if data is None:
            raise ImageInvalid(f"blob {descriptor.digest} is missing from {where}")
        verify_descriptor(descriptor, data)
        return data

    entry, ref_name = choose_entry(parse_json(index_bytes, f"{where}/index.json"), where, name)
    if entry.media_type in INDEX_TYPES:
        nested = parse_json(fetch(entry), f"index {entry.digest}")
        entry, _ = choose_entry(nested, f"index {entry.digest}", None, platform_of=True)
        if entry.media_type in INDEX_TYPES:
            raise ImageInvalid(f"{where}: index {entry.digest} nests more than one level")
    return image_from_manifest(entry, fetch, ref_name, layers=layers)


def choose_entry(
    index: dict[str, Any], where: str, name: str | None, *, platform_of: bool = False
) -> tuple[Descriptor, str | None]:
    """The entry of ``index`` named ``name`` (else the first, or with ``platform_of`` the first
    for this host's platform), with its ref.name."""
    raw = index.get("manifests")
    if not isinstance(raw, list) or not raw:
        raise ImageInvalid(f"{where}: the index lists no manifests")
    entries = [(Descriptor.from_json(e, where), _annotations(e)) for e in raw]
    if name is not None:
        for descriptor, annotations in entries:
            if annotations.get(REF_NAME) == name:
                return descriptor, name
        names = sorted({str(a[REF_NAME]) for _, a in entries if REF_NAME in a})
        raise ImageNotFound(
            f"{where} has no image named {name!r}",
            hint=f"names in it: {', '.join(names)}" if names else "its images have no names",
        )
    if platform_of:
        host = {"os": "linux", "architecture": host_architecture()}
        for (descriptor, _), e in zip(entries, raw, strict=True):
            found = e.get("platform")
            if isinstance(found, dict) and all(found.get(k) == v for k, v in host.items()):
                return descriptor, None
    descriptor, annotations = entries[0]
    ref = annotations.get(REF_NAME)
    return descriptor, ref if isinstance(ref, str) else None


def _annotations(raw: dict[str, Any]) -> dict[str, Any]:
    annotations = raw.get("annotations")
    return annotations if isinstance(annotations, dict) else {}


def read_layout(path: Path, *, name: str | None = None) -> Image:
    """The image in an OCI image layout directory, or in a tar (or tar.gz) of one; ``name``
    picks the image by its ``org.opencontainers.image.ref.name`` annotation."""
    if path.is_dir():

        def read(relative: str) -> bytes | None:
            target = path / relative
            return target.read_bytes() if target.is_file() else None

        return _load(read, str(path), name)
    if path.is_file():
        return _read_tar(path.read_bytes(), str(path), name)
    raise ImageNotFound(
        f"no image layout at {path}",
        hint="give a directory in the OCI image layout, or a tar of one",
    )


def read_layout_bytes(data: bytes, *, name: str | None = None) -> Image:
    """The image in a tar (or tar.gz) of an OCI image layout held in memory."""
    return _read_tar(data, "the uploaded layout", name)


@dataclass(frozen=True)
class LayoutFile:
    """An image layout in a tar on disk: the image with its manifest and config read (its
    ``blobs`` hold those two), and each layer read as a file from the tar, never whole."""

    image: Image
    tar: tarfile.TarFile
    members: Mapping[str, tarfile.TarInfo]  # the layout's files, by their path in it

    def open_blob(self, digest: str) -> IO[bytes]:
        """A layer's bytes as a file to read (unchecked: the reader checks them)."""
        member = self.members.get(_blob_path(digest))
        file = self.tar.extractfile(member) if member is not None else None
        if file is None:
            raise ImageInvalid(f"blob {digest} is missing from the uploaded layout")
        return file


def read_layout_file(file: IO[bytes], *, where: str = "the uploaded layout") -> LayoutFile:
    """The image in a tar (or tar.gz) of an OCI image layout in ``file`` (seekable), its
    layers left in the file: memory holds the manifest and config only."""
    try:
        tar = tarfile.open(fileobj=file, mode="r:*")  # noqa: SIM115 (the LayoutFile's)
        members = _layout_members(tar)
        image = _load(_reader(tar, members), where, None, layers=False)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise _unreadable_tar(where, exc) from exc
    return LayoutFile(image, tar, members)


def _unreadable_tar(where: str, exc: Exception) -> ImageInvalid:
    return ImageInvalid(
        f"{where} is not a readable tar of an OCI image layout: {exc}",
        hint="give a tar (or tar.gz) of a directory in the OCI image layout",
    )


def _layout_members(tar: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    """The files of the tar by their path in the layout (a tar of the layout's directory
    itself has the directory's name before each)."""
    members = {posixpath.normpath(m.name).lstrip("/"): m for m in tar.getmembers() if not m.isdir()}
    if "oci-layout" in members:
        return members
    tops = [n for n in members if n.count("/") == 1 and n.endswith("/oci-layout")]
    if len(tops) != 1:
        return members
    prefix = tops[0].rsplit("/", 1)[0] + "/"
    return {n.removeprefix(prefix): m for n, m in members.items() if n.startswith(prefix)}


def _reader(
    tar: tarfile.TarFile, members: Mapping[str, tarfile.TarInfo]
) -> Callable[[str], bytes | None]:
    def read(relative: str) -> bytes | None:
        member = members.get(relative)
        file = tar.extractfile(member) if member is not None else None
        return file.read() if file is not None else None

    return read


def _read_tar(data: bytes, where: str, name: str | None) -> Image:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            return _load(_reader(tar, _layout_members(tar)), where, name)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise _unreadable_tar(where, exc) from exc
