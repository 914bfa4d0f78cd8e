"""Workers as the rest of the cluster sees them."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from souq.model.base import Record
from souq.model.resources import Resources

__all__ = [
    "Fingerprint",
    "Heartbeat",
    "Load",
    "PreemptibleRoom",
    "WorkerInfo",
    "WorkerState",
    "WorkerUsage",
]


class WorkerState(StrEnum):
    UP = "up"
    DOWN = "down"
    CORDONED = "cordoned"
    DRAINING = "draining"  # cordoned, and stopping its machines (souq workers drain)


class Fingerprint(Record):
    hostname: str
    os: str
    arch: str
    cpus: float
    memory_mb: int
    disk_mb: int = Field(default=0, description="free disk of the data dir at start, in MiB")
    gpus: int = 0
    gpu_model: str | None = Field(default=None, description="the model of its GPUs")
    drivers: list[str] = Field(default_factory=lambda: ["exec"])
    isolation: dict[str, Any] = Field(
        default_factory=lambda: {"cgroups": "none", "enforced": []},
        description='resource limits: {"cgroups": "v2"|"v1"|"none", "enforced": [controllers]}',
    )
    machine_user: str = Field(
        default="", description="who machines run as: NAME (UID:GID); empty if not known"
    )
    underlay: str = Field(
        default="",
        description="the host address other workers route this worker's private addresses "
        "(its /48) to; empty: its machines are reached from its own host only",
    )
    underlay_key: str = Field(
        default="",
        description="its WireGuard public key when it encrypts what goes between hosts "
        "(agent --underlay-encryption wireguard); empty: it does not",
    )
    underlay_link: str = Field(
        default="",
        description="the IPv6 link-local address of its underlay device, when it takes its "
        "machines' traffic straight from workers on its IPv4 link (agent --underlay-link "
        "auto, the default, or direct); empty: over VXLAN",
    )


class Load(Record):
    """What a worker's host measures right now (not what is reserved): placement's live view."""

    cpu_percent: float = Field(default=0.0, description="host CPU busy, 0-100")
    memory_used_mb: int = Field(default=0, description="host memory in use, in MiB")
    memory_percent: float = Field(default=0.0, description="host memory in use, 0-100")


class PreemptibleRoom(Record):
    """What the machines of one priority class on a worker reserve that a create of a higher
    class could take (souq.market.preemption: displaceable, holding a reservation, settled): a
    broker's book reads it to send a create that fits nowhere straight to a claim that
    preempts, without asking whom each worker would displace. An estimate: the worker's claim
    chooses the victims on its own ledger."""

    priority_class: str
    resources: Resources = Field(description="what they reserve together")
    machines: int = Field(description="how many (batch job runs among them)")
    cheapest: float | None = Field(
        default=None, description="the lowest bid (max_price) among them; null: none has one"
    )


_PREEMPTIBLE = (
    "what each lower priority class could free here (spot, then standard); null from a "
    "worker that does not say"
)


class WorkerInfo(Record):
    id: str
    region: str
    state: WorkerState = WorkerState.UP
    capacity: Resources
    allocated: Resources
    labels: dict[str, str] = Field(default_factory=dict)
    fingerprint: Fingerprint | None = None
    machines: int = Field(default=0, description="machines not destroyed")
    last_seen: int | None = Field(default=None, description="ms since epoch of the last heartbeat")
    version: int = Field(
        default=0,
        description="the worker's ledger version: it grows with every change of what the "
        "worker has promised, so the newest allocation heard wins",
    )
    load: Load | None = Field(default=None, description="what the host measures right now")
    images: list[str] = Field(
        default_factory=list, description="images cached on the worker (sha256:…), newest first"
    )
    gpu_free: list[int] = Field(
        default_factory=list,
        description="free thousandths of each of its GPUs, by index (1000: a whole GPU free); "
        "empty from a worker that does not say",
    )
    gpu_shapes: dict[str, int] = Field(
        default_factory=dict,
        description="its GPU machines by shape: 'share' (a share of one GPU) or the count of "
        "whole GPUs ('1', '2', ...); GPU placement policies read it",
    )
    preemptible: list[PreemptibleRoom] | None = Field(default=None, description=_PREEMPTIBLE)


class Heartbeat(Record):
    worker: WorkerInfo
    seq: int
    interval_s: float
    reconnects: int = Field(
        default=0,
        description="how many times the worker has reconnected to the bus; a change tells "
        "brokers to re-list its machines (it may have missed requests and lost events)",
    )
    layers: list[str] = Field(
        default_factory=list,
        description="the image layers the worker holds, each by the first 16 hex digits of its "
        "digest: brokers estimate from them how much a worker would pull for an image",
    )
    protocol: int = Field(
        default=0, description="the minor version of the bus protocol the worker speaks"
    )


class WorkerUsage(Record):
    """What a worker has promised, sent on ``souq.use.<region>.<worker>`` whenever it changes
    (a claim, a destroy, a quote): brokers keep their book of free capacity fresh with it
    between heartbeats, and a refused claim carries one. The highest ``version`` wins."""

    worker_id: str
    region: str
    state: WorkerState = WorkerState.UP
    capacity: Resources
    allocated: Resources = Field(description="what machines reserve and live quotes hold")
    version: int
    machines: int = Field(default=0, description="machines not destroyed")
    gpu_free: list[int] = Field(
        default_factory=list,
        description="free thousandths of each of its GPUs, by index (1000: a whole GPU free); "
        "empty from a worker that does not say",
    )
    preemptible: list[PreemptibleRoom] | None = Field(default=None, description=_PREEMPTIBLE)
