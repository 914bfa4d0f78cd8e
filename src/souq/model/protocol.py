"""Messages between brokers and workers. Each travels as JSON over the bus; replies to requests
travel inside a :class:`Reply` envelope so that typed errors cross the wire intact."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from souq.model.base import Input, Record
from souq.model.choices import PriorityClass
from souq.model.image import ImageRecord
from souq.model.machine import Machine, MachineConfig, MachineEvent, MachineState
from souq.model.placement import Placement
from souq.model.policy import PlacementPolicy
from souq.model.resources import Resources
from souq.model.secrets import MinSecretsVersion, SkipSecrets
from souq.model.worker import Load, WorkerInfo

__all__ = [
    "ClaimRequest",
    "CordonCommand",
    "DestroyCommand",
    "DigestCommand",
    "EventsCommand",
    "HoldRequest",
    "Lease",
    "LeaseRequest",
    "ListCommand",
    "LocateCommand",
    "LocateReply",
    "LogsCommand",
    "LogsReply",
    "MachineEventMessage",
    "MachineRef",
    "Offer",
    "OfferRequest",
    "OfferedEviction",
    "Quote",
    "QuoteRef",
    "QuoteState",
    "Reply",
    "SignalCommand",
    "StartCommand",
    "StopCommand",
    "UpdateCommand",
    "WaitCommand",
    "WorkerDigest",
]


class OfferRequest(Input):
    """Request for offers, scattered on a region's subject."""

    request_id: str
    app: str
    region: str
    resources: Resources
    image: str | None = Field(default=None, description="the machine's image (sha256:…)")
    image_layers: dict[str, int] = Field(
        default_factory=dict,
        description="its layers: bytes by short digest (the first 16 hex digits), in order",
    )
    priority_class: PriorityClass | None = Field(
        default=None,
        description="set when the machine may displace machines of a lower class: the "
        "worker's offer says whom it would displace (souq.market.preemption)",
    )
    max_victims: int = Field(default=0, ge=0, description="the most machines it may displace")


class OfferedEviction(Record):
    """What a worker would displace to take the machine (an offer to a preempting create)."""

    victims: int = Field(description="machines displaced (0: it has the room)")
    freed: Resources = Field(description="what they reserve")
    gpu_free: list[int] = Field(default_factory=list, description="each GPU's free share after")
    top_class: int = Field(description="the rank of the highest class displaced (-1: none)")
    unbounded: int = Field(default=0, description="victims that bid without limit")
    priced: float = Field(default=0.0, description="the sum of the other victims' bids")
    running: int = Field(default=0, description="victims that run")
    estimated: bool = Field(
        default=False,
        description="the broker's estimate from its book (what each lower class could free "
        "there, as the worker last said), not the worker's own plan: the claim chooses",
    )

    def key(self) -> tuple[int, int, int, float, int]:
        """Smaller is better (souq.market.preemption.Eviction.key)."""
        return self.top_class, self.victims, self.unbounded, self.priced, self.running


class Offer(Record):
    """A worker's answer to a request for offers. ``eligible`` is false when the worker cannot take
    the machine; ``reason`` then says why (``full``, ``cordoned`` ...)."""

    worker: WorkerInfo
    eligible: bool
    reason: str | None = None
    detail: str | None = None
    existing_machine_id: str | None = Field(
        default=None, description="a machine this worker already made for the same request id"
    )
    load: Load | None = Field(default=None, description="the host's measured use right now")
    image_layers: int | None = Field(
        default=None, description="how many of the wanted image's layers the worker holds"
    )
    image_bytes: int | None = Field(
        default=None, description="bytes the worker would pull to run the image (0: cached)"
    )
    app_machines: int = Field(
        default=0, description="machines of the requesting app on this worker, not destroyed"
    )
    eviction: OfferedEviction | None = Field(
        default=None, description="a preempting create's offer: whom the worker would displace"
    )


class ClaimRequest(Input):
    """Sent to one worker: reserve the capacity and create the machine, atomically."""

    request_id: str
    body_hash: str
    app: str
    name: str | None = None
    region: str
    config: MachineConfig
    skip_launch: bool = False
    skip_secrets: SkipSecrets = False
    min_secrets_version: MinSecretsVersion = 0
    placement: Placement | None = None
    region_chosen: str | None = Field(
        default=None, description="why the broker chose the region (the create named none)"
    )
    quote_id: str | None = Field(
        default=None, description="use this worker's hold instead of new capacity"
    )
    policy: PlacementPolicy | None = Field(
        default=None, description="how the broker ranks offers for it (the create's placement)"
    )
    image: ImageRecord | None = Field(
        default=None, description="the image `config.image` names, as the broker resolved it"
    )
    network: str = Field(
        default="",
        max_length=128,
        description="the private network its app is on (souq.network.addresses.network_of); "
        "empty: the default organization's",
    )
    preempt: int = Field(
        default=0,
        ge=0,
        description="when it does not fit: displace at most this many machines of a class "
        "below its own (0: displace none)",
    )


class MachineRef(Input):
    app: str
    machine_id: str
    lease_nonce: str | None = Field(
        default=None, description="the nonce of the machine's lease, if it is leased"
    )


class StartCommand(MachineRef):
    """Start a stopped machine, or resume a suspended one."""

    wake: bool = Field(
        default=False,
        description="the edge proxy's start for traffic (a wake-up for a request, a standby's "
        "failover): the machine starts as it is, and a lease does not block it (a deploy "
        "leases every machine of the app; it must not take the app offline meanwhile)",
    )


class LeaseRequest(MachineRef):
    """Take the machine's lease (or, with its nonce, extend it)."""

    ttl_s: float = Field(default=30.0, gt=0, le=3600, description="seconds it lasts")
    description: str = Field(default="", max_length=256, description="who holds it, and why")


class Lease(Record):
    """A machine's lease: while it lasts, changing the machine needs its ``nonce``."""

    machine_id: str
    nonce: str
    expires_at: int = Field(description="ms since the epoch")
    description: str = ""
    version: int = Field(default=1, description="grows each time the lease is extended")


class StopCommand(MachineRef):
    signal: str | None = None
    timeout_s: float | None = None


class UpdateCommand(MachineRef):
    """Replace a machine's config on its worker: a started machine restarts with the new one
    (stopped with its stop config first), a stopped one starts unless ``skip_launch``."""

    config: MachineConfig
    image: ImageRecord | None = Field(default=None, description="the image `config.image` names")
    skip_launch: bool = False
    skip_secrets: SkipSecrets = False
    min_secrets_version: MinSecretsVersion = 0


class SignalCommand(MachineRef):
    signal: str


class DestroyCommand(MachineRef):
    force: bool = False
    graceful: bool = Field(
        default=False,
        description="a running machine is stopped first (its stop config) instead of killed; "
        "the answer comes once it has left rotation (`destroying`)",
    )


class WaitCommand(MachineRef):
    state: MachineState
    timeout_s: float
    healthy: bool = Field(
        default=False, description="and every health check passing (a started machine)"
    )
    states: list[MachineState] = Field(
        default_factory=list, description="more states, any of which will do (Fly's)"
    )
    instance_id: str | None = Field(
        default=None, description="and at this version of its config (Fly's `version`)"
    )


class LogsCommand(MachineRef):
    offset: int = 0
    max_bytes: int = 65536
    wait_s: float = Field(default=0.0, description="long-poll: wait this long for new output")


class LogsReply(Record):
    data: str
    next_offset: int
    finished: bool = Field(
        description="no more output will come: the machine is destroyed, or down (stopped, "
        "failed) with no restart coming"
    )


class EventsCommand(MachineRef):
    pass


class ListCommand(Input):
    app: str | None = None
    include_destroyed: bool = False


class DigestCommand(Input):
    """Ask a worker for the digest of its machines (the cluster view's anti-entropy)."""


class LocateCommand(Input):
    machine_id: str


class HoldRequest(Input):
    """Sent to one worker: hold capacity for a machine like ``config`` for ``ttl_s`` (a quote)."""

    quote_id: str
    app: str
    region: str
    config: MachineConfig
    ttl_s: float = Field(gt=0, le=3600)
    placement: Placement | None = None


class QuoteRef(Input):
    app: str
    quote_id: str


class QuoteState(StrEnum):
    HELD = "held"
    USED = "used"
    EXPIRED = "expired"
    RELEASED = "released"


class Quote(Record):
    """Capacity a worker holds for a machine that is not made yet: a dry run that binds."""

    id: str
    app: str
    region: str
    worker_id: str
    state: QuoteState
    resources: Resources
    config: MachineConfig
    ttl_s: float
    created_at: str
    expires_at: str
    machine_id: str | None = Field(default=None, description="the machine that used the hold")
    placement: Placement | None = None


class CordonCommand(Input):
    cordoned: bool


class DrainCommand(Input):
    """Cordon the worker and stop its machines gracefully (each with its stop config)."""


class LocateReply(Record):
    worker_id: str
    found: bool


class MachineEventMessage(Record):
    """Published on ``souq.evt.<region>.<worker>`` for every state change of a machine."""

    machine_id: str
    app: str
    worker_id: str
    region: str
    state: MachineState
    event: MachineEvent
    machine: Machine | None = Field(
        default=None,
        description="the whole record, on a machine's first event (launch): a view learns a "
        "new machine from its events alone, without asking the worker",
    )


class WorkerDigest(Record):
    """A worker's answer on ``souq.all.digest`` (anti-entropy): a hash over the ``(id, state,
    updated_at)`` of its machines not destroyed (see :func:`souq.view.digest.machines_digest`)."""

    worker_id: str
    machines: int
    digest: str


class Reply(Record):
    """Envelope of every reply: ``ok`` with a ``result``, or an ``error`` body."""

    ok: bool
    result: Any = None
    error: dict[str, Any] | None = None
