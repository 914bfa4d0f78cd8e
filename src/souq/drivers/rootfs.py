"""A machine's root file system: its image's files, shared and read-only, under a writable layer
of the machine's own (overlayfs), as Docker and containerd give a container.

The image's files are unpacked once per worker (``images/<hex>/rootfs``, root's, see
:mod:`souq.images.cache`) and never copied per machine. For each machine of an image, the agent
mounts, in the host's mount namespace, under the machine's own directory:

``lower``  the image's files through an *idmapped* mount (``mount_setattr(MOUNT_ATTR_IDMAP)``,
           Linux 5.12+): files the image's root owns are seen as owned by the machine's own
           uid, whose root inside its user namespace that uid is; nothing is chowned or copied;
``upper``  its writable layer (``upper/`` and overlayfs's ``work/``), owned by its uid;
``root``   the overlay of the two: the sandbox binds it as the machine's ``/``.

So two machines of one image never see each other's writes, and the image is never changed.
The writable layer starts empty at every start unless the machine's config keeps it
(``rootfs.persist``, Fly's name: ``always``), as a Fly machine's root file system is reset by a
restart. The mounts outlive the agent (a machine keeps running through an agent restart) and are
taken down when the machine is destroyed. A machine updated to another image mounts the new
image's files at its next start (``layers/lower.image`` says which image ``lower`` holds).

The user namespace an idmapped mount maps through is made ahead of the start that needs it
(:mod:`souq.drivers.userns`). A machine that runs as root itself (``--machine-user root``)
needs no idmap: its lower layer is the image's files as they are. The syscalls without a
wrapper in Python (``open_tree``, ``mount_setattr``, ``move_mount``, ``mount``, ``umount2``) are
called through libc.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
from pathlib import Path

from souq.drivers.base import SpawnError
from souq.drivers.userns import USERNS

__all__ = ["MachineRoot", "can_mount", "mounts_under", "unmount_under"]

_libc = ctypes.CDLL(None, use_errno=True)

# x86_64 and aarch64 share the new mount API's numbers (asm-generic).
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_IDMAP = 0x1, 0x00100000
_MNT_DETACH = 0x2


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def can_mount() -> bool:
    """Whether this agent may mount (it is root in the host's namespaces)."""
    return os.geteuid() == 0


def _idmapped(source: Path, target: Path, uid: int) -> None:
    """Mount ``source`` at ``target``, read-only, its root-owned files seen as ``uid``'s."""
    userns = USERNS.take(uid)
    tree = -1
    try:
        tree = _check(
            _libc.syscall(
                _SYS_OPEN_TREE,
                _AT_FDCWD,
                os.fsencode(source),
                _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC,
            ),
            "open_tree",
        )
        attr = _MountAttr(_MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY, 0, 0, userns)
        _check(
            _libc.syscall(
                _SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, ctypes.byref(attr),
                ctypes.sizeof(attr),
            ),
            "mount_setattr",
        )  # fmt: skip
        _check(
            _libc.syscall(
                _SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, os.fsencode(target),
                _MOVE_MOUNT_F_EMPTY_PATH,
            ),
            "move_mount",
        )  # fmt: skip
    finally:
        os.close(userns)
        if tree >= 0:
            os.close(tree)


def _overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    for path in (lower, upper, work):
        if any(c in str(path) for c in ",:\\"):
            raise SpawnError(f"{path}: a path with ',' ':' or '\\' cannot be an overlay layer")
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    _check(
        _libc.mount(b"overlay", os.fsencode(target), b"overlay", 0, options.encode()),
        "mount overlay",
    )


def _mounted(path: Path) -> bool:
    """Whether something is mounted at ``path`` (a bind of the same file system too, which
    ``os.path.ismount`` cannot tell)."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            point = line.split(b" ", 5)[4]
            if _unescape(point) == target:
                return True
    return False


def _unescape(field: bytes) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are octal escapes."""
    text = os.fsdecode(field)
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def mounts_under(mountinfo: bytes, directory: str) -> list[str]:
    """The mount points of ``mountinfo`` at or under ``directory`` (a real path), deepest
    first: the order they can be taken down in."""
    inside = directory.rstrip("/") + "/"
    points = set()
    for line in mountinfo.splitlines():
        fields = line.split(b" ", 5)
        if len(fields) > 4:
            point = _unescape(fields[4])
            if point == directory or point.startswith(inside):
                points.add(point)
    return sorted(points, key=lambda p: (-p.count("/"), p))


def unmount_under(directory: Path) -> list[str]:
    """Detach every mount at or under ``directory`` (machines' roots and layers, volumes' file
    systems) once nothing of its machines runs: what a worker's data directory leaves in the
    host's mount table when the worker is taken down for good. Returns what it detached."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            found = mounts_under(f.read(), os.path.realpath(directory))
    except OSError:
        return []
    detached = []
    for point in found:
        if _libc.umount2(os.fsencode(point), _MNT_DETACH) == 0:
            detached.append(point)
    return detached


def _unmount(path: Path) -> None:
    for _ in range(16):  # stacked mounts, each taken down
        if not _mounted(path):
            return
        if _libc.umount2(os.fsencode(path), _MNT_DETACH) < 0:
            err = ctypes.get_errno()
            if err == 22:  # EINVAL: not a mount point (any more)
                return
            raise OSError(err, f"umount {path}: {os.strerror(err)}")


class MachineRoot:
    """The root file system of one machine of an image, under ``base`` (the agent's, one per
    machine: ``root/`` is the mount, which the machine's uid reaches through ``base`` (0711),
    and ``layers/`` (0700) holds ``lower``, ``upper`` and ``work``, reached only through the
    mount). ``uid`` None: the machine runs as the agent's user, no idmap."""

    def __init__(self, base: Path, image: Path, uid: int | None) -> None:
        self.base = base
        self.image = image
        self.uid = uid
        layers = base / "layers"
        self.layers = layers
        self.lower = layers / "lower"
        self.upper = layers / "upper"
        self.work = layers / "work"
        self.root = base / "root"
        self.lower_source = layers / "lower.image"  # which image's files ``lower`` mounts

    def _lower_of(self) -> str | None:
        try:
            return self.lower_source.read_text()
        except OSError:
            return None

    def mount(self, *, persist: bool) -> Path:
        """Mount it (again, after a stop) and return what the sandbox binds as ``/``: with
        ``persist`` False the writable layer starts empty."""
        fresh = not self.base.exists()  # a new machine: nothing of it can be mounted yet
        try:
            if not fresh:
                _unmount(self.root)
            if not persist:
                for layer in (self.upper, self.work):
                    if layer.exists():
                        shutil.rmtree(layer)
            self.base.mkdir(parents=True, exist_ok=True, mode=0o711)
            self.layers.mkdir(exist_ok=True, mode=0o700)
            for made in (self.lower, self.upper, self.work, self.root):
                made.mkdir(exist_ok=True, mode=0o755)
            if self.uid is not None:  # the overlay's / is its upper layer's: root's inside
                os.chown(self.upper, self.uid, self.uid, follow_symlinks=False)
            lower = self.image
            if self.uid is not None:
                if not fresh and _mounted(self.lower) and self._lower_of() != str(self.image):
                    _unmount(self.lower)  # of the image the machine ran before an update
                if fresh or not _mounted(self.lower):
                    _idmapped(self.image, self.lower, self.uid)
                    self.lower_source.write_text(str(self.image))
                lower = self.lower
            _overlay(lower, self.upper, self.work, self.root)
        except OSError as exc:
            raise SpawnError(f"cannot mount the machine's root file system: {exc}") from exc
        return self.root

    def remove(self) -> None:
        """Take its mounts down and remove its layers (the machine is destroyed)."""
        for path in (self.root, self.lower):
            with contextlib.suppress(OSError):
                _unmount(path)
        if not _mounted(self.root) and not _mounted(self.lower):
            shutil.rmtree(self.base, ignore_errors=True)
