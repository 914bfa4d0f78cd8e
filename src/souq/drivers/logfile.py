"""A machine's output log, bounded: ``output.log`` (the current file) and ``output.log.1`` (the
one before it), each about ``max_bytes`` at most.

With souq-waiter (the default) the machine's stdout and stderr are a pipe its waiter owns,
and the waiter writes what comes through into ``output.log``, bounded as it writes: once the
file holds ``max_bytes`` it is renamed ``output.log.1`` and a new one begun (see waiter.c).
Neither file is ever over the bound, however fast the machine writes, and the waiter needs no
agent: the stream goes on while the agent restarts. ``output.log.state`` then also names the
current file's inode (``ino``), so that a reader can tell a rotation under way (the rename
done, the state not yet written) and read on as if it were finished.

Without the waiter the machine writes its output itself, straight into ``output.log`` opened
for appending: the agent is not in the way, so a machine never waits for
it and keeps writing while no agent runs. The agent rotates the file from outside, every
second (:class:`LogRotator`): once the current file is over ``max_bytes``, its head (whole
file-system blocks, all but the last part) is copied to ``output.log.1`` and then *collapsed*
out of the file (``fallocate(FALLOC_FL_COLLAPSE_RANGE)``), which the kernel does under the
same inode lock as the machine's appends: no byte is lost or reordered, and the machine's
descriptor stays valid. Where the file system cannot collapse (tmpfs, some others), the
rotation falls back to copy-then-truncate, and output written in the instant between the two
may be lost. That bound is not held at every instant: a machine can write more than
``max_bytes`` between two checks.

Readers see one stream of *logical* offsets: ``output.log.state`` holds ``base``, the
logical offset of the current file's first byte, so that ``souq machine logs`` reads on across
a rotation; what was rotated out twice is gone, and a read from before it starts at the oldest
byte kept (:func:`output_start`).

A rotation is crash safe: it records ``rotating`` (the bytes being moved) before it renames the
copy into place, and :func:`recover` finishes or undoes a rotation an agent crash interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["LOG", "LogRotator", "output_start", "read_output", "recover", "rotate"]

log = logging.getLogger(__name__)

LOG = "output.log"
ROTATED = "output.log.1"
STATE = "output.log.state"
_TMP = ".tmp"
_FALLOC_FL_COLLAPSE_RANGE = 0x08
_COMPARE = 4096  # bytes compared to tell whether an interrupted collapse happened


@dataclass(frozen=True, slots=True)
class LogState:
    base: int = 0  # the logical offset of output.log's first byte
    rotating: int = 0  # bytes being moved to output.log.1 (0: no rotation under way)
    ino: int = 0  # the inode of output.log the base is of (its waiter's log); 0: the agent's


def read_state(workdir: Path) -> LogState:
    try:
        raw = json.loads((workdir / STATE).read_text())
        return LogState(
            base=int(raw.get("base", 0)),
            rotating=int(raw.get("rotating", 0)),
            ino=int(raw.get("ino", 0)),
        )
    except (OSError, ValueError, AttributeError):
        return LogState()


def _write_state(workdir: Path, state: LogState) -> None:
    tmp = workdir / (STATE + _TMP)
    tmp.write_text(json.dumps({"base": state.base, "rotating": state.rotating}))
    os.replace(tmp, workdir / STATE)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


# -- reading -----------------------------------------------------------------------------------


_SNAPSHOT_TRIES = 100  # a waiter's rotation is a rename and a small write: over at once


@dataclass(slots=True)
class _Files:
    """Both files of a log, open, and where the current one begins in the stream."""

    current: BinaryIO | None
    rotated: BinaryIO | None
    base: int  # the logical offset of current's first byte (rotated ends there)
    rotated_size: int

    def close(self) -> None:
        for f in (self.current, self.rotated):
            if f is not None:
                f.close()


def _open(path: Path) -> BinaryIO | None:
    try:
        return open(path, "rb")  # closed by _Files.close
    except FileNotFoundError:
        return None


def _ino(f: BinaryIO | None) -> int:
    return 0 if f is None else os.fstat(f.fileno()).st_ino


def _files(workdir: Path) -> _Files:
    """Both files, opened together: a waiter's rotation (a rename, then the state) may happen
    meanwhile, so the state is read again after the opens, and the pair is taken only if the
    current file is the one the state names (or the one it names was just renamed to
    ``output.log.1``: the rotation's state is not written yet) and is not ``output.log.1``."""
    for _ in range(_SNAPSHOT_TRIES):
        state = read_state(workdir)
        files = _Files(_open(workdir / LOG), _open(workdir / ROTATED), state.base, 0)
        if files.rotated is not None:
            files.rotated_size = os.fstat(files.rotated.fileno()).st_size
        current, rotated = _ino(files.current), _ino(files.rotated)
        if not state.ino or (state.ino == current and current != rotated):
            consistent = True
        elif state.ino == rotated and current not in {0, rotated}:
            files.base += files.rotated_size  # the rename is done; its state is coming
            consistent = True
        else:
            consistent = False
        if consistent and read_state(workdir) == state:
            return files
        files.close()
    return _Files(_open(workdir / LOG), None, read_state(workdir).base, 0)


def output_start(workdir: Path) -> int:
    """The logical offset of the oldest byte of output still kept."""
    files = _files(workdir)
    files.close()
    return files.base - files.rotated_size


def read_output(workdir: Path, offset: int, max_bytes: int) -> tuple[bytes, int]:
    """Up to ``max_bytes`` of output from logical ``offset`` (from the oldest byte kept, if
    ``offset`` is older), and the logical size of the output so far."""
    files = _files(workdir)
    try:
        base, current = files.base, files.current
        if current is None:
            return b"", base
        total = base + os.fstat(current.fileno()).st_size
        start = max(offset, base - files.rotated_size)
        if start >= total or max_bytes <= 0:
            return b"", total
        if start >= base:
            current.seek(start - base)
            return current.read(min(max_bytes, total - start)), total
        if files.rotated is None:
            return b"", total
        files.rotated.seek(start - (base - files.rotated_size))
        return files.rotated.read(min(max_bytes, base - start)), total
    finally:
        files.close()


# -- rotating ----------------------------------------------------------------------------------


def rotate(workdir: Path, max_bytes: int) -> bool:
    """Rotate ``workdir``'s log if it is over ``max_bytes``; True if it did."""
    path = workdir / LOG
    if _size(path) <= max_bytes or read_state(workdir).ino:  # (ino: its waiter bounds it)
        return False
    recover(workdir)
    state = read_state(workdir)
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        block = os.fstatvfs(f.fileno()).f_bsize or 4096
        head = (size - 1) // block * block  # whole blocks, short of the end (the kernel's rule)
        if head and _SUPPORTED.get(os.fstat(f.fileno()).st_dev, True):
            # The newest max_bytes of the head are kept: output.log.1 stays within the bound.
            keep = min(head, max_bytes)
            _copy(f.fileno(), workdir / (ROTATED + _TMP), head - keep, keep)
            _write_state(workdir, LogState(base=state.base, rotating=head))
            os.replace(workdir / (ROTATED + _TMP), workdir / ROTATED)
            err = _fallocate(f.fileno(), _FALLOC_FL_COLLAPSE_RANGE, 0, head)
            if not err:
                _write_state(workdir, LogState(base=state.base + head))
                return True
            _write_state(workdir, state)  # nothing moved: output.log.1 is overwritten below
            if err not in {errno.EOPNOTSUPP, errno.EINVAL}:
                raise OSError(err, f"cannot collapse the log's head: {os.strerror(err)}")
            _SUPPORTED[os.fstat(f.fileno()).st_dev] = False
            log.info("%s cannot collapse a file's head: logs rotate by copy and truncate", path)
        moved = _copy(f.fileno(), workdir / (ROTATED + _TMP), 0, None)
        if moved > max_bytes:  # the newest max_bytes are kept
            with open(workdir / (ROTATED + _TMP), "r+b") as r:
                _collapse_or_copy(r, moved - max_bytes)
        os.replace(workdir / (ROTATED + _TMP), workdir / ROTATED)
        os.ftruncate(f.fileno(), 0)  # (the machine's appends go on at the new end)
        _write_state(workdir, LogState(base=state.base + moved))
        return True


def recover(workdir: Path) -> None:
    """Finish or undo a rotation an agent crash interrupted."""
    (workdir / (ROTATED + _TMP)).unlink(missing_ok=True)  # not renamed: output.log is whole
    state = read_state(workdir)
    if not state.rotating:
        return
    head = state.rotating
    rotated, path = workdir / ROTATED, workdir / LOG
    collapsed = True
    kept = _size(rotated)
    if kept and _size(path) >= head:
        n = min(_COMPARE, kept)
        with open(rotated, "rb") as r, open(path, "r+b") as f:
            r.seek(kept - n)  # output.log.1 ends where the head did
            f.seek(head - n)
            if r.read(n) == f.read(n):  # the head is still there: the collapse did not happen
                collapsed = False
                _collapse(f.fileno(), head)
    log.info("recovered the output log of %s (collapse %s)", workdir.name, collapsed)
    _write_state(workdir, LogState(base=state.base + head))


def _copy(fd: int, target: Path, start: int, length: int | None) -> int:
    """Copy ``length`` bytes (None: to the end) from ``start`` of ``fd`` to ``target``."""
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    copied = 0
    try:
        while length is None or copied < length:
            want = 1 << 20 if length is None else min(1 << 20, length - copied)
            n = os.sendfile(out, fd, start + copied, want)
            if n == 0:
                break
            copied += n
    finally:
        os.close(out)
    return copied


_libc: ctypes.CDLL | None = None


def _fallocate(fd: int, mode: int, offset: int, length: int) -> int:
    """fallocate(2); 0, or the errno."""
    global _libc  # noqa: PLW0603 (loaded once)
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if _libc.fallocate(fd, mode, offset, length) == 0:
        return 0
    return ctypes.get_errno()


_SUPPORTED: dict[int, bool] = {}  # by device: False once a collapse was refused


def _collapse_or_copy(f: BinaryIO, length: int) -> None:
    """Drop the first ``length`` bytes of a file nobody else writes."""
    f.seek(length)
    rest = f.read()
    f.seek(0)
    f.write(rest)
    f.truncate()


def _collapse(fd: int, length: int) -> None:
    err = _fallocate(fd, _FALLOC_FL_COLLAPSE_RANGE, 0, length)
    if err:
        raise OSError(err, f"cannot collapse the log's head: {os.strerror(err)}")


# -- the agent's side --------------------------------------------------------------------------


class LogRotator:
    """Every ``interval_s``, rotates each machine's log under ``root`` (``root/<id>/``) that is
    over ``max_bytes``. A log that fails to rotate is logged and tried again next time."""

    def __init__(self, root: Path, *, max_bytes: int, interval_s: float) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.interval_s = interval_s
        self.rotations = 0

    def recover_all(self) -> None:
        for workdir in self._dirs():
            with contextlib.suppress(OSError):
                recover(workdir)

    def sweep(self) -> None:
        for workdir in self._dirs():
            try:
                if rotate(workdir, self.max_bytes):
                    self.rotations += 1
            except FileNotFoundError:
                pass  # destroyed meanwhile
            except OSError as exc:
                log.warning("cannot rotate the output log of %s: %s", workdir.name, exc)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.sweep()

    def _dirs(self) -> list[Path]:
        try:
            with os.scandir(self.root) as entries:
                return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return []
