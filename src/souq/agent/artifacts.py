"""The worker's artifact cache, as placement sees it: the artifacts of the machines it has run,
newest first, at most :data:`CACHE_SIZE`.

The exec driver runs a command, so nothing is fetched yet; the list records what a worker with
an image driver would hold, so that cache locality already steers placement. It is derived from
the machine records (kept in the store), so it survives an agent restart.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from souq.agent.records import MachineRow

__all__ = ["CACHE_SIZE", "ArtifactCache"]

CACHE_SIZE = 32


class ArtifactCache:
    """Artifacts newest first, without repeats, bounded; recomputed only when a machine record
    that names an artifact was added since the last look (a config never changes, so that is
    the only change)."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._size = size
        self._seen = -1
        self._artifacts: list[str] = []

    def artifacts(self, made: int, rows: Callable[[], Collection[MachineRow]]) -> list[str]:
        """The cache, given how many machine records naming an artifact were ever made (a
        change marker) and a way to read them, called only when that number changed."""
        if made != self._seen:
            newest = sorted(rows(), key=lambda r: r.created_at, reverse=True)
            found: dict[str, None] = {}
            for row in newest:
                artifact = row.config.artifact
                if artifact is not None and artifact not in found:
                    found[artifact] = None
                    if len(found) >= self._size:
                        break
            self._artifacts = list(found)
            self._seen = made
        return self._artifacts
