"""Why a worker cannot take a machine: every code a placement's rejections, an offer's
``reason`` and a refused claim's ``details.reason`` carry, named once.

The placement stages (:mod:`souq.placement.filters`, :mod:`souq.placement.gpus`), the column
form the simulator runs (:mod:`souq.sim.columns`) and the worker's admission core
(:mod:`souq.agent.capacity.admission`) say a reason by its name here; the codes on the wire are the
values, which do not change (docs/placement.md lists each with the stage that gives it).
Pure.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["CLOSED", "SHORT_OF_ROOM", "Reason"]


class Reason(StrEnum):
    # Capacity: the worker is of the right kind, but short of room.
    INSUFFICIENT_CPU = "insufficient_cpu"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    INSUFFICIENT_DISK = "insufficient_disk"
    INSUFFICIENT_GPUS = "insufficient_gpus"  # fewer whole GPUs free than asked
    INSUFFICIENT_GPU_SHARE = "insufficient_gpu_share"  # no GPU with the share asked left on it
    NO_PORTS = "no_ports"  # the worker's range of host ports is used up
    NO_PREEMPTIBLE = "no_preemptible"  # full, and nothing of a lower class to displace
    # Kind: the worker is not what the request asks for.
    WRONG_GPU_MODEL = "wrong_gpu_model"
    CONSTRAINT = "constraint"  # a constraint of the machine's placement is not met
    DRIVER_MISSING = "driver_missing"  # the worker cannot run the machine's driver
    # Where the app's other machines (or volumes) are.
    DISTINCT_WORKERS = "distinct_workers"  # the worker runs a sibling of the served group
    STANDBY_PRIMARY = "standby_primary"  # the worker runs a machine this one stands by for
    VOLUME_ELSEWHERE = "volume_elsewhere"  # the machine's volume is on another worker
    VOLUME_ZONE_TAKEN = "volume_zone_taken"  # a volume of a unique zone has its sibling here
    # Out of play.
    CORDONED = "cordoned"
    DRAINING = "draining"
    WRONG_REGION = "wrong_region"
    DECLINED = "declined"  # the worker's offer said no and gave no reason
    # The app's private network is not known (its broker could not read the app's record): a
    # worker that gives every sandboxed machine a private address refuses the claim, never
    # guessing (docs/network.md).
    NETWORK_UNKNOWN = "network_unknown"


# For want of room: the worker is of the right kind, but too full for the machine (cpu, memory,
# disk, GPUs). Another worker, or this one later, may take it.
SHORT_OF_ROOM: Final = frozenset(
    {
        Reason.INSUFFICIENT_CPU,
        Reason.INSUFFICIENT_MEMORY,
        Reason.INSUFFICIENT_DISK,
        Reason.INSUFFICIENT_GPUS,
        Reason.INSUFFICIENT_GPU_SHARE,
    }
)
# The worker takes no new machines (its state: souq.model.worker.WorkerState, of the same names).
CLOSED: Final = frozenset({Reason.CORDONED, Reason.DRAINING})
