"""What the pipeline is asked to place: the parts of a machine config that filters and scorers
read, plus the request id that seeds every random choice."""

from __future__ import annotations

from dataclasses import dataclass

from souq.model.constraint import Constraint
from souq.model.image import ImageRecord
from souq.model.machine import MachineConfig
from souq.model.resources import Resources

__all__ = ["PlacementRequest", "WantedImage", "for_volume", "short_digest"]

SHORT_DIGEST = 16  # hex digits of a layer's digest that name it in heartbeats


def short_digest(digest: str) -> str:
    """A layer's name in heartbeats: the first 16 hex digits of its digest."""
    return digest.partition(":")[2][:SHORT_DIGEST]


@dataclass(frozen=True)
class WantedImage:
    """The image a machine runs, as placement sees it: its layers and their sizes."""

    reference: str
    layers: tuple[tuple[str, int], ...]  # (short digest, bytes), in order

    @property
    def size(self) -> int:
        return sum(size for _, size in self.layers)

    @classmethod
    def of(cls, record: ImageRecord) -> WantedImage:
        return cls(record.reference, tuple((short_digest(x.digest), x.size) for x in record.layers))

    def missing(self, held: frozenset[str] | set[str], *, cached: bool = False) -> tuple[int, int]:
        """(layers held, bytes to pull) on a worker holding the layers ``held``, or caching the
        whole image (``cached``: every layer, nothing to pull)."""
        if cached:
            return len(self.layers), 0
        have = pull = 0
        for digest, size in self.layers:
            if digest in held:
                have += 1
            else:
                pull += size
        return have, pull


@dataclass(frozen=True)
class PlacementRequest:
    request_id: str
    app: str
    region: str
    resources: Resources
    constraints: tuple[Constraint, ...] = ()
    distinct_workers_for: str | None = None  # "app": at most one machine of the app per worker
    image: WantedImage | None = None  # what the machine runs; cached on some workers
    driver: str | None = None  # None: any (isolated where the worker can)
    # A standby's: the workers of the machines it stands by for (it must not share their fate).
    avoid_workers: frozenset[str] = frozenset()
    # A machine that mounts a volume: the worker that holds it (nowhere else will do).
    volume_worker: str | None = None
    volume_id: str | None = None  # that volume (named in the explanation)
    # A volume with a unique zone: the workers that hold the volumes it must not share one with.
    volume_avoid: frozenset[str] = frozenset()

    @classmethod
    def for_machine(
        cls,
        request_id: str,
        app: str,
        region: str,
        config: MachineConfig,
        *,
        avoid_workers: frozenset[str] = frozenset(),
        image: ImageRecord | None = None,
        volume: tuple[str, str] | None = None,
    ) -> PlacementRequest:
        """The request to place a machine of ``config``: the one place that reads a config.
        ``volume``: (the volume it mounts, the worker that holds it)."""
        return cls(
            volume_id=volume[0] if volume else None,
            volume_worker=volume[1] if volume else None,
            avoid_workers=avoid_workers,
            request_id=request_id,
            app=app,
            region=region,
            resources=config.guest.resources(),
            constraints=tuple(config.constraints),
            distinct_workers_for=config.distinct_workers_for,
            image=None if image is None else WantedImage.of(image),
            driver=config.driver,
        )


def for_volume(
    request_id: str, app: str, region: str, size_gb: int, avoid: frozenset[str] = frozenset()
) -> PlacementRequest:
    """The request to place a volume: its size as disk (MiB per GiB), on none of ``avoid``."""
    return PlacementRequest(
        request_id=request_id,
        app=app,
        region=region,
        resources=Resources(cpus=0, memory_mb=0, disk_mb=size_gb * 1024),
        volume_avoid=avoid,
    )
