"""Batch creates: many machines of one config placed in one call (Sparrow's batch sampling).

Over HTTP: ``POST /v1/apps/{app}/machines/batch`` with a :class:`BatchCreateRequest`, answered
with a :class:`BatchResult`. Between broker and worker: claims (:class:`BatchClaimRequest`,
``souq.worker.<id>.claim_batch``), each answered with a :class:`BatchClaimReply` holding every
machine it made in full. One NATS message carries at most the server's ``max_payload`` (1 MiB
by default), so a worker's share of a batch goes in claims of :func:`machines_per_claim`
machines each, one after the other.
"""

from __future__ import annotations

from pydantic import Field

from souq.model.base import Input, Record
from souq.model.image import ImageRecord
from souq.model.machine import Machine, MachineConfig
from souq.model.placement import OfferOutcome, Placement, Sampling, Timings
from souq.model.secrets import MinSecretsVersion, SkipSecrets

__all__ = [
    "BatchClaim",
    "BatchClaimReply",
    "BatchClaimRequest",
    "BatchCreateRequest",
    "BatchPlacement",
    "BatchResult",
    "machines_per_claim",
]

# What a machine's record holds beyond its config and placement (ids, times, its first events),
# at most; and the share of a message its machines may fill (the rest: the reply's envelope).
MACHINE_OVERHEAD_BYTES = 4096
REPLY_SHARE = 0.5


class BatchCreateRequest(Input):
    """``POST /v1/apps/{app}/machines/batch``: ``count`` machines of one config.

    Immediate-or-cancel, like a single create: the call places what it can now and never
    queues the rest. ``min_count`` says how much is enough: if fewer than ``min_count`` could be
    placed, the machines made are destroyed again and the answer is ``409
    insufficient_capacity`` (all-or-nothing, the default: ``min_count = count``). With a lower
    ``min_count`` the answer is ``201`` with the machines placed and, for the rest, the reasons.
    """

    region: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="where to place them")
    count: int = Field(ge=1, description="how many machines")
    min_count: int | None = Field(
        default=None, ge=1, description="fewest acceptable; default: count (all or nothing)"
    )
    skip_launch: bool = Field(default=False, description="create them, but do not start them")
    skip_secrets: bool = Field(
        default=False, description="Fly's: give them none of the app's secrets, ever"
    )
    min_secrets_version: int = Field(
        default=0,
        ge=0,
        description="start them with the app's secrets as of this version or later (a broker "
        "asks at least for the last version it wrote itself)",
    )
    config: MachineConfig


class BatchClaimRequest(Input):
    """Sent to one worker: create one machine per request id, all of one config; all of them
    fit or none is made. A known request id returns the machine already made for it. Every
    machine stores the same ``placement`` record (this worker's share of the batch)."""

    request_id: str = Field(description="the batch's request id")
    body_hash: str
    app: str
    region: str
    config: MachineConfig
    skip_launch: bool = False
    skip_secrets: SkipSecrets = False
    min_secrets_version: MinSecretsVersion = 0
    request_ids: list[str] = Field(min_length=1, description="one per machine")
    placement: Placement | None = None
    image: ImageRecord | None = Field(default=None, description="the image `config.image` names")
    network: str = Field(default="", max_length=128, description="its app's private network")


class BatchClaimReply(Record):
    machines: list[Machine] = Field(description="one per item, in the items' order")


class BatchClaim(Record):
    """One batch claim the broker sent: ``count`` machines on one worker."""

    worker_id: str
    count: int
    ok: bool
    reason: str | None = None


class BatchPlacement(Record):
    """Why a batch landed where it did: the offers (sampled or not), the ranking, how many
    machines went to each worker, and every claim tried."""

    request_id: str
    region: str
    policy: str = "best-fit"
    requested: int
    min_count: int
    placed: int = 0
    expected_offers: int = 0
    offers_received: int = 0
    sampled: Sampling | None = None
    rejections: dict[str, int] = Field(default_factory=dict, description="count per reason")
    offers: list[OfferOutcome] = Field(
        default_factory=list, description="the initial ranking, best first (at most 50)"
    )
    assignments: dict[str, int] = Field(
        default_factory=dict, description="machines placed per worker"
    )
    claims: list[BatchClaim] = Field(default_factory=list)
    rounds: int = Field(default=0, description="claim rounds (a refused claim re-assigns)")
    source: str = Field(default="offers", description="`book` or `offers`: see Placement.source")
    timings: Timings = Field(default_factory=Timings)


class BatchResult(Record):
    """The answer to a batch create."""

    requested: int
    placed: int
    machines: list[Machine] = Field(default_factory=list)
    unplaced: list[str] = Field(
        default_factory=list, description="why the rest could not be placed, when placed < count"
    )
    placement: BatchPlacement


def machines_per_claim(config: MachineConfig, placement: Placement | None, max_payload: int) -> int:
    """How many machines of ``config`` one claim may carry so that its reply, every machine's
    record in full, fits in a message of ``max_payload`` bytes (at least one)."""
    size = len(config.model_dump_json()) + MACHINE_OVERHEAD_BYTES
    if placement is not None:
        size += len(placement.model_dump_json())
    return max(1, int(max_payload * REPLY_SHARE) // size)
