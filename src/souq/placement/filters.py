"""Filters: each accepts an offer or rejects it with one named reason.

The reasons are stable codes (they are counted in every placement record and named in
``insufficient_capacity`` errors):

=======================  ==================================================================
``cordoned``             the worker is cordoned: it takes no new machines
``draining``             the worker is draining its machines away
``wrong_region``         the offer came from a worker of another region
``driver_missing``       the worker has no driver for the machine
``constraint``           one of the machine's constraints does not hold on the worker
``distinct_workers``     the worker already runs a machine of the app (``distinct_workers_for``)
``standby_primary``      the worker runs a machine this standby stands by for (``standbys``)
``volume_elsewhere``     the machine mounts a volume another worker holds (``mounts``)
``volume_zone_taken``    a volume with a unique zone: the worker holds its sibling volume
``wrong_gpu_model``      the worker's GPUs are not of the model the machine asks for
``insufficient_gpus``    fewer wholly free GPUs than the whole GPUs asked for
``insufficient_gpu_share``  no single GPU has the share's thousandths free (``gpu_milli``)
``insufficient_cpu``     and ``insufficient_memory``, ``insufficient_disk``: the worker lacks
                         free capacity
(the worker's own)       a worker that declines says why; :class:`EligibleFilter` keeps it
=======================  ==================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from souq.model.protocol import Offer
from souq.model.reasons import Reason
from souq.model.worker import WorkerState
from souq.placement.constraints import unmet
from souq.placement.gpus import free_on, gpu_misfit
from souq.placement.request import PlacementRequest
from souq.placement.stages import Rejection, shortfall

__all__ = [
    "ConstraintFilter",
    "DistinctWorkersFilter",
    "DriverFilter",
    "EligibleFilter",
    "GpuFilter",
    "RegionFilter",
    "ResourcesFilter",
    "StandbyFilter",
    "StateFilter",
    "VolumeFilter",
]


# A worker in these states takes no new machines: its state is the reason.
_CLOSED: dict[WorkerState, Reason] = {
    WorkerState.CORDONED: Reason.CORDONED,
    WorkerState.DRAINING: Reason.DRAINING,
}


@dataclass(frozen=True)
class StateFilter:
    """A worker that takes no new machines (cordoned, draining) is out, whatever else it says."""

    name: str = "state"

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        reason = _CLOSED.get(offer.worker.state)
        if reason is not None:
            return Rejection(reason, f"worker {offer.worker.id} is {reason}: no new machines")
        return None


@dataclass(frozen=True)
class RegionFilter:
    """Only workers of the requested region: a stray offer from elsewhere never wins."""

    name: str = "region"

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        region = offer.worker.region
        if region == request.region:
            return None
        return Rejection(Reason.WRONG_REGION, f"worker is in region {region}, not {request.region}")


@dataclass(frozen=True)
class DriverFilter:
    """The worker must have the machine's driver. A worker that does not say (no fingerprint)
    is given the benefit of the doubt: its claim fails if it really cannot run it."""

    name: str = "driver"

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        fp = offer.worker.fingerprint
        if fp is None or request.driver is None or request.driver in fp.drivers:
            return None
        return Rejection(
            Reason.DRIVER_MISSING,
            f"worker has drivers {', '.join(fp.drivers) or 'none'}, not {request.driver}",
            unmet=f"driver {request.driver}",
        )


@dataclass(frozen=True)
class ConstraintFilter:
    """Every constraint of the machine must hold; the first that does not is named."""

    name: str = "constraints"

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        for constraint in request.constraints:
            why = unmet(constraint, offer)
            if why is not None:
                text = str(constraint)
                return Rejection(Reason.CONSTRAINT, f"{text}: {why}", unmet=text)
        return None


@dataclass(frozen=True)
class DistinctWorkersFilter:
    """``distinct_workers_for: app``: a worker that already runs a machine of the app is out."""

    name: str = "distinct-workers"

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        if request.distinct_workers_for != "app" or offer.app_machines == 0:
            return None
        n = offer.app_machines
        return Rejection(
            Reason.DISTINCT_WORKERS,
            f"worker already runs {n} machine{'s' if n > 1 else ''} of app {request.app}",
            unmet="distinct_workers_for: app",
        )


@dataclass(frozen=True)
class StandbyFilter:
    """A standby never shares a worker with the machines it stands by for: it is there for
    when their worker is lost."""

    name: str = "standby"

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        if offer.worker.id not in request.avoid_workers:
            return None
        return Rejection(
            Reason.STANDBY_PRIMARY,
            "worker runs a machine this standby stands by for",
            unmet="standbys: another worker",
        )


@dataclass(frozen=True)
class VolumeFilter:
    """A machine that mounts a volume runs on the worker that holds it, and only there; a new
    volume that asks for a unique zone goes to none of the workers holding its siblings."""

    name: str = "volume"

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        worker = offer.worker.id
        pinned = request.volume_worker
        if pinned is not None and worker != pinned:
            return Rejection(
                Reason.VOLUME_ELSEWHERE,
                f"the machine mounts volume {request.volume_id}, held by worker {pinned}",
                unmet=f"worker {pinned} (volume {request.volume_id})",
            )
        if worker in request.volume_avoid:
            return Rejection(
                Reason.VOLUME_ZONE_TAKEN,
                "the worker holds another volume of the app this one must not share it with",
                unmet="require_unique_zone",
            )
        return None


@dataclass(frozen=True)
class GpuFilter:
    """A machine that asks for GPUs needs a worker whose GPUs are of its model (if it names one)
    and have room for it GPU by GPU: whole GPUs wholly free, a share on one GPU with that much
    free. Before the worker's own verdict, so that a refusal names the GPU rather than the cpu
    a GPU worker happens to lack as well."""

    name: str = "gpus"

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        want = request.resources
        if not want.wants_gpu:
            return None
        w = offer.worker
        misfit = gpu_misfit(want, w.capacity, free_on(w))
        if misfit is None:
            return None
        reason, detail = misfit
        asked = f"gpu_model {want.gpu_model}" if reason == Reason.WRONG_GPU_MODEL else None
        return Rejection(reason, detail, unmet=asked)


@dataclass(frozen=True)
class EligibleFilter:
    """The worker itself declined (full, cordoned ...): keep its own reason, the most precise
    (it counts its quotes' holds, which the broker cannot see)."""

    name: str = "eligible"

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        if offer.eligible:
            return None
        reason = offer.reason or Reason.DECLINED
        return Rejection(reason, offer.detail or f"worker declined: {reason}")


@dataclass(frozen=True)
class ResourcesFilter:
    """Free capacity must hold the machine's cpus, memory, disk and gpus (GPU by GPU)."""

    name: str = "resources"

    def check(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        w = offer.worker
        short = shortfall(request.resources, w.capacity, w.allocated, w.gpu_free)
        return None if short is None else Rejection(short.reason, short.detail)
