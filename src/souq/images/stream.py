"""A layer pulled as a stream: its chunks arrive on the event loop and go, in a thread, through
the digest, into the blob file and through the unpacker at once, so that a pull costs about
what the slower of the network and the disk costs, not their sum.

:class:`LayerStream` is fed from the event loop (:meth:`~LayerStream.feed`, then
:meth:`~LayerStream.end`) and read by :meth:`~LayerStream.unpack`, which runs in a thread:
every byte read is hashed and written to the blob file; the unpacker reads the same bytes as a
tar stream. When the tar ends before the blob does (gzip's trailer, padding), the rest is still
read, so the digest covers every byte. The caller compares the digest before it trusts any of
it: a mismatch discards the blob and the files unpacked.
"""

from __future__ import annotations

import hashlib
import io
import queue
from dataclasses import dataclass
from pathlib import Path

from souq.images.layers import Budget, unpack_layer

__all__ = ["LayerStream", "Streamed"]


@dataclass(frozen=True)
class Streamed:
    digest: str  # sha256:… of every byte fed
    size: int
    error: Exception | None  # the unpacker's, if it failed (after the digest: see unpack)


class LayerStream(io.RawIOBase):
    def __init__(self, blob: Path) -> None:
        super().__init__()
        self._chunks: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._view = memoryview(b"")
        self._ended = False
        self._blob = blob
        self._file: io.BufferedWriter | None = None
        self._hash = hashlib.sha256()
        self._size = 0

    # -- the event loop's side -------------------------------------------------------------

    def feed(self, chunk: bytes) -> None:
        if chunk:
            self._chunks.put(chunk)

    def end(self) -> None:
        self._chunks.put(b"")

    # -- the thread's side -----------------------------------------------------------------

    def unpack(self, media_type: str, dest: Path, budget: Budget | None = None) -> Streamed:
        """Read the whole stream (until :meth:`end`): into the blob file, through the digest,
        and unpacked onto ``dest``. Unpacking errors are returned, not raised: the digest
        decides first whether the bytes were the layer at all."""
        error: Exception | None = None
        with open(self._blob, "wb") as self._file:
            try:
                unpack_layer(self, media_type, dest, budget=budget)  # type: ignore[arg-type]
            except Exception as exc:
                error = exc
            while self.read(1 << 20):
                pass  # the rest (or all, after an error): every byte is hashed and kept
        return Streamed("sha256:" + self._hash.hexdigest(), self._size, error)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._view and not self._ended:
            chunk = self._chunks.get()
            if not chunk:  # the end
                self._ended = True
                break
            self._hash.update(chunk)
            self._size += len(chunk)
            assert self._file is not None
            self._file.write(chunk)
            self._view = memoryview(chunk)
        n = min(len(buffer), len(self._view))
        buffer[:n] = self._view[:n]
        self._view = self._view[n:]
        return n
