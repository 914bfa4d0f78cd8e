"""Layer tars: pack a directory into one deterministic gzip layer, and unpack a layer safely.

A layer is a tar of a file-system change set (OCI image-spec, "Image Layer Filesystem
Changeset"). Packing makes the same bytes for the same directory every time: entries sorted,
mtime 0, uid/gid 0, no user or group names, gzip mtime 0 and a fixed compression level.

Unpacking writes nothing outside its destination: absolute names, ``..`` components, hard links
to outside, device files and FIFOs are refused (:class:`~souq.errors.ImageInvalid`), and every
write first checks that its parent directory resolves inside the destination (so a symlink from
an earlier entry or layer cannot carry a write out). A symlink itself is kept as it is, whatever
it points at: an image is a root file system, whose absolute links (Debian's
``/etc/alternatives/awk -> /usr/bin/mawk``) resolve in the machine's root, where it runs; on
the host nothing follows them out (writes are checked as above, and the program lookup of
:mod:`souq.drivers.programs` follows links within the image). Whiteouts are applied to what
the earlier layers left: ``.wh.NAME`` removes ``NAME``, ``.wh..wh..opq`` empties its directory.
A layer is read as a stream, each entry written as it comes, so a refused layer may leave the
destination half-written: unpack into a fresh directory and discard it on error. A
:class:`Budget` bounds what an unpack writes (each entry's header, each file's bytes as they
are written), and a :class:`Pool` what the unpacks under way at once write together: past
either, :class:`~souq.errors.ImageTooLarge` at once, so a small compressed layer that inflates
to gigabytes stops where its bound is, however many are unpacked at once.

:func:`check_layer` reads a layer the same way without writing anything: its digest, its size
and every entry's safety (what the store checks at an upload, so a layer that unpacking would
refuse is refused when it is pushed, naming the entry).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import stat
import tarfile
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from souq.errors import ImageInvalid, ImageTooLarge

__all__ = [
    "ENTRY_BYTES",
    "LAYER_MEDIA_TYPES",
    "MEDIA_DOCKER_LAYER",
    "MEDIA_LAYER_GZIP",
    "MEDIA_LAYER_TAR",
    "Budget",
    "PackedLayer",
    "Pool",
    "check_layer",
    "pack_layer",
    "unpack_layer",
]

MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
MEDIA_DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"

# media type -> the tarfile mode that reads it as a stream (front to back, no seeking)
_READ_MODE: dict[str, Literal["r|gz", "r|"]] = {
    MEDIA_LAYER_GZIP: "r|gz",
    MEDIA_DOCKER_LAYER: "r|gz",
    MEDIA_LAYER_TAR: "r|",
}
LAYER_MEDIA_TYPES = frozenset(_READ_MODE)

_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_GZIP_LEVEL = 6  # part of the reference: changing it changes every packed image's digest
ENTRY_BYTES = 512  # what an entry costs a budget besides its bytes (a tar header; an inode)
_COPY_BYTES = 1 << 20


class Pool:
    """Bytes several unpacks share at once (a worker cache's pulls under way), counted from
    their threads."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Count ``n`` more bytes; whether the pool is still within its limit."""
        with self._lock:
            self.used += n
            return self.used <= self.limit

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


@dataclass
class Budget:
    """What an unpack may still write, in bytes, and the :class:`Pool` it shares with the
    unpacks beside it, if any; ``what`` says whose bound it is (the error's words: e.g. "the
    worker's image cache (256 MiB)")."""

    left: int
    limit: int
    what: str
    subject: str = "the image"
    pool: Pool | None = None

    @classmethod
    def of(
        cls, limit: int, what: str, subject: str = "the image", pool: Pool | None = None
    ) -> Budget:
        return cls(limit, limit, what, subject, pool)

    @property
    def used(self) -> int:
        return self.limit - self.left

    def take(self, n: int, name: str) -> None:
        self.left -= n
        shared = self.pool is None or self.pool.take(n)
        if self.left < 0 or not shared:
            why = (
                f"unpacks to more than {self.limit} bytes, what {self.what} allows"
                if self.left < 0
                else f"and the images unpacking beside it pass what {self.what} allows, "
                f"at {self.used} bytes of its own"
            )
            raise ImageTooLarge(
                f"{self.subject} {why}: stopped at layer entry {name!r}",
                hint="make the image smaller, or give the worker a larger image cache "
                "(souq agent --image-cache-mb)",
                details={"limit_bytes": self.limit},
            )


@dataclass(frozen=True)
class PackedLayer:
    """One packed layer: its gzip bytes and its ``diff_id`` (sha256 of the uncompressed tar)."""

    data: bytes
    diff_id: str


class _HashingGzip(io.RawIOBase):
    """A write-only file: hashes what it is given (the tar) and gzips it into memory."""

    def __init__(self) -> None:
        super().__init__()
        self._out = io.BytesIO()
        self._hash = hashlib.sha256()
        self._gzip = gzip.GzipFile(
            filename="", fileobj=self._out, mode="wb", compresslevel=_GZIP_LEVEL, mtime=0
        )

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._hash.update(data)
        return self._gzip.write(data)

    def finish(self) -> PackedLayer:
        self._gzip.close()
        return PackedLayer(self._out.getvalue(), "sha256:" + self._hash.hexdigest())


def _walk(root: str, rel: str = "") -> Iterator[tuple[str, str, os.stat_result]]:
    """(name in the layer, path on disk, lstat) of everything under ``root``, sorted, each
    directory before what it holds."""
    with os.scandir(os.path.join(root, rel)) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        name = f"{rel}/{entry.name}" if rel else entry.name
        st = entry.stat(follow_symlinks=False)
        yield name, entry.path, st
        if stat.S_ISDIR(st.st_mode):
            yield from _walk(root, name)


def pack_layer(root: Path) -> PackedLayer:
    """One deterministic gzip layer of the regular files, directories and symlinks under
    ``root`` (modes kept, hard links stored as separate files); sockets, FIFOs and devices are
    refused rather than skipped."""
    out = _HashingGzip()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, path, st in _walk(str(root)):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif stat.S_ISLNK(st.st_mode):
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(path)
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.size = st.st_size
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                raise ImageInvalid(
                    f"{path} is a {_kind(st.st_mode)}: an image holds only regular files, "
                    "directories and symlinks",
                    hint="remove it, or pack a directory that does not contain it",
                )
    return out.finish()


def _kind(mode: int) -> str:
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    return "device file"


# -- unpacking ----------------------------------------------------------------------------------


def _refuse(name: str, why: str) -> ImageInvalid:
    return ImageInvalid(
        f"layer entry {name!r} {why}",
        hint="the layer is unsafe to unpack; rebuild the image from a clean directory",
    )


def _clean(raw: str) -> str:
    """A layer entry's name relative to the root ("" for the root), or refused."""
    if raw.startswith("/"):
        raise _refuse(raw, "has an absolute path")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(raw, "has a '..' component")
    return "/".join(parts)


# What a layer entry is: a file-system entry to write, a whiteout (the path it hides), an opaque
# marker (the directory it empties), or nothing to do.
_Kind = Literal["entry", "whiteout", "opaque", "skip"]


def _classify(member: tarfile.TarInfo) -> tuple[_Kind, str]:
    """What ``member`` asks for, and of which path; unsafe entries are refused."""
    name = _clean(member.name)
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise _refuse(member.name, "is a device file or FIFO")
    if member.islnk() and (member.linkname.startswith("/") or ".." in member.linkname.split("/")):
        raise _refuse(member.name, f"is a hard link to {member.linkname!r}, outside the image")
    parent, base = os.path.split(name)
    if base == _OPAQUE:
        return "opaque", parent
    if base.startswith(_WHITEOUT + _WHITEOUT):
        return "skip", name  # other ".wh..wh." names are reserved; the spec says to ignore them
    if base.startswith(_WHITEOUT):
        hidden = base[len(_WHITEOUT) :]
        if hidden in ("", ".", ".."):
            raise _refuse(member.name, "is a whiteout of nothing")
        return "whiteout", os.path.join(parent, hidden)
    if name:
        return "entry", name
    if not member.isdir():
        raise _refuse(member.name, "replaces the root directory")
    return "skip", name


def _inside(root: str, path: str, name: str) -> str:
    """``path`` resolved, refused when it leads outside ``root`` (through a symlink)."""
    real = os.path.realpath(path)
    if real != root and not real.startswith(root + os.sep):
        raise _refuse(name, "leads outside the destination through a symlink")
    return real


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def unpack_layer(
    source: bytes | IO[bytes], media_type: str, dest: Path, *, budget: Budget | None = None
) -> None:
    """Apply one layer (its bytes, or a stream of them, of ``media_type``) on top of ``dest``
    (created if missing). The layer is read once, front to back, and each entry written as it
    comes: a layer streamed from the network is unpacked while it arrives. With ``budget``,
    what it writes is counted against it (:class:`~souq.errors.ImageTooLarge` past it)."""
    read_mode = _READ_MODE.get(media_type)
    if read_mode is None:
        raise ImageInvalid(
            f"layer media type {media_type!r} is not supported",
            hint=f"use one of {', '.join(sorted(LAYER_MEDIA_TYPES))}",
        )
    dest.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(dest)
    fileobj = io.BytesIO(source) if isinstance(source, bytes) else source
    # Whiteouts hide what the layers below left, never this layer's own entries: what this
    # layer wrote is remembered and spared, wherever its whiteouts sit in the tar.
    own: set[str] = set()
    try:
        with tarfile.open(fileobj=fileobj, mode=read_mode) as tar:
            for member in tar:
                kind, name = _classify(member)
                if budget is not None:
                    budget.take(ENTRY_BYTES, member.name)
                if kind == "entry":
                    _extract(tar, member, name, root, budget)
                    own.add(name)
                elif kind == "whiteout" and name not in own:
                    parent = _inside(root, os.path.join(root, os.path.dirname(name)), name)
                    _remove(os.path.join(parent, os.path.basename(name)))
                elif kind == "opaque":
                    _empty(root, name, own)
    except (tarfile.ReadError, tarfile.CompressionError, EOFError, zlib.error) as exc:
        raise _unreadable(media_type, exc) from exc
    except gzip.BadGzipFile as exc:
        raise _unreadable(media_type, exc) from exc


def _unreadable(media_type: str, exc: Exception) -> ImageInvalid:
    what = "valid gzip" if isinstance(exc, gzip.BadGzipFile) else "a readable tar"
    return ImageInvalid(
        f"layer ({media_type}) is not {what}: {exc}",
        hint="the blob is truncated or not the media type its descriptor says",
    )


class _Hashing(io.RawIOBase):
    """A file read through: hashes and counts every byte read."""

    def __init__(self, source: IO[bytes], algorithm: str) -> None:
        super().__init__()
        self._source = source
        self.hash = hashlib.new(algorithm)
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._source.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.hash.update(data)
        self.size += n
        return n


def check_layer(source: bytes | IO[bytes], media_type: str, digest: str, size: int) -> None:
    """Read one layer without writing it: :class:`~souq.errors.ImageInvalid` naming the layer
    and the entry that unpacking would refuse (an absolute or ``..`` path, a device file or
    FIFO, a hard link leading outside the root, an entry under one of the layer's symlinks),
    or when its bytes are not ``size`` bytes hashing to ``digest``."""
    read_mode = _READ_MODE.get(media_type)
    if read_mode is None:
        raise ImageInvalid(
            f"layer {digest}: media type {media_type!r} is not supported",
            hint=f"use one of {', '.join(sorted(LAYER_MEDIA_TYPES))}",
        )
    algorithm = digest.partition(":")[0]
    reader = _Hashing(io.BytesIO(source) if isinstance(source, bytes) else source, algorithm)
    problem: ImageInvalid | None = None
    try:
        with tarfile.open(fileobj=io.BufferedReader(reader, _COPY_BYTES), mode=read_mode) as tar:
            links: set[str] = set()  # the layer's symlinks so far
            for member in tar:
                kind, name = _classify(member)
                _not_through(links, member.name, name + "/" if kind == "opaque" else name)
                if member.issym():
                    links.add(name)
                else:
                    links.discard(name)
    except ImageInvalid as exc:
        problem = exc
    except (tarfile.ReadError, tarfile.CompressionError, EOFError, zlib.error) as exc:
        problem = _unreadable(media_type, exc)
    except gzip.BadGzipFile as exc:
        problem = _unreadable(media_type, exc)
    while reader.read(_COPY_BYTES):
        pass  # the rest: the digest covers every byte
    actual = f"{algorithm}:{reader.hash.hexdigest()}"
    if actual != digest or reader.size != size:
        raise ImageInvalid(
            f"blob {digest} does not match its descriptor: {reader.size} bytes (not {size}) "
            f"hashing to {actual}",
            hint="the layout is corrupt or was changed after it was written; export it again",
        )
    if problem is not None:
        raise ImageInvalid(f"layer {digest}: {problem.message}", hint=problem.hint) from problem


def _not_through(links: set[str], raw: str, name: str) -> None:
    """Refuse an entry that a symlink of its own layer would carry elsewhere: a layer packed
    from a directory never has one (its entries are real paths), and where it leads is only
    known where it is unpacked (a link may point anywhere, resolved in the machine's root)."""
    parent = os.path.dirname(name)
    while parent:
        if parent in links:
            raise _refuse(raw, f"is written through the layer's symlink {parent!r}")
        parent = os.path.dirname(parent)


def _empty(root: str, directory: str, own: set[str]) -> None:
    """An opaque directory: what the layers below left in it goes."""
    real = _inside(root, os.path.join(root, directory), directory)
    if os.path.isdir(real):
        for child in os.listdir(real):
            if os.path.join(directory, child) not in own:
                _remove(os.path.join(real, child))


def _extract(
    tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, root: str, budget: Budget | None
) -> None:
    parent = _inside(root, os.path.join(root, os.path.dirname(name)), name)
    os.makedirs(parent, exist_ok=True)
    target = os.path.join(parent, os.path.basename(name))
    # setuid/setgid are dropped; a directory stays the owner's to fill and to delete.
    mode = stat.S_IMODE(member.mode) & ~(stat.S_ISUID | stat.S_ISGID)
    if member.isdir():
        if not (os.path.isdir(target) and not os.path.islink(target)):
            _remove(target)
            os.mkdir(target)
        os.chmod(target, mode | stat.S_IRWXU)
    elif member.issym():
        _remove(target)
        os.symlink(member.linkname, target)
    elif member.islnk():
        linked = _clean(member.linkname)
        source_dir = _inside(root, os.path.join(root, os.path.dirname(linked)), name)
        source = os.path.join(source_dir, os.path.basename(linked))
        if not os.path.lexists(source) or os.path.isdir(source):
            raise _refuse(name, f"is a hard link to {member.linkname!r}, which is not a file")
        _remove(target)
        os.link(source, target, follow_symlinks=False)
    else:
        _remove(target)
        src = tar.extractfile(member)
        assert src is not None  # a regular file
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with src, os.fdopen(os.open(target, flags, 0o600), "wb") as out:
            while chunk := src.read(_COPY_BYTES):
                if budget is not None:
                    budget.take(len(chunk), member.name)  # before it is on disk
                out.write(chunk)
            os.fchmod(out.fileno(), mode)
        os.utime(target, (member.mtime, member.mtime))
