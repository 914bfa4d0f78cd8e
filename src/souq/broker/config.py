"""The broker's configuration: typed, frozen, validated, unknown keys rejected."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from souq.limits import HttpLimits
from souq.market.preemption import DEFAULT_MAX_VICTIMS
from souq.model.base import copy_fields
from souq.model.policy import PlacementDefaults
from souq.model.prices import SpotPriceRule

__all__ = ["BrokerConfig"]

Seconds = Annotated[float, Field(gt=0)]  # a timeout or an interval: longer than nothing
AtLeastOne = Annotated[int, Field(ge=1)]  # a count or a limit that zero would make meaningless
_HTTP = HttpLimits()  # the defaults


class BrokerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    nats_url: str = Field(description="NATS server to join, e.g. nats://127.0.0.1:4222")
    auth_dir: Path | None = Field(
        default=None,
        description="the cluster's auth directory (souq cluster init): every route but "
        "/healthz and /openapi.json then needs a token; none: the API is open",
    )
    nats_connect_timeout_s: Seconds = Field(
        default=5.0, description="the first connection to NATS must succeed within this"
    )
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(default=4280, ge=0, le=65535, description="0 picks a free port")
    offer_timeout_s: Seconds = Field(
        default=0.3, description="how long to gather offers from a region's workers"
    )
    claim_timeout_s: Seconds = Field(
        default=5.0,
        description="how long one claim may go unanswered before it is sent again (to a worker "
        "still heard) or given up (a silent one)",
    )
    claim_patience_s: Seconds = Field(
        default=60.0,
        description="how long in all a claim may wait on a worker whose heartbeats still "
        "arrive (a busy one), sent again every `claim_timeout_s`, before it is given up",
    )
    quota_reservation_s: Seconds = Field(
        default=120.0,
        description="a create's quota reservation stands this long unsettled (its broker "
        "gone); then it is reconciled against the machines that exist (docs/quotas.md)",
    )
    command_timeout_s: Seconds = Field(
        default=10.0, description="how long a worker may take to answer a command"
    )
    gather_timeout_s: Seconds = Field(
        default=2.0, description="how long to gather list and locate answers"
    )
    max_claim_attempts: AtLeastOne = Field(
        default=3,
        description="unanswered claims (or batch claim rounds) before giving up; a refused "
        "claim moves on to the next offer",
    )
    preempt_max_victims: int = Field(
        default=DEFAULT_MAX_VICTIMS,
        ge=0,
        le=64,
        description="the most machines one create may displace when it fits nowhere and its "
        "priority class allows (0: never preempt); see docs/placement.md",
    )
    spot_price: SpotPriceRule = Field(
        default_factory=SpotPriceRule,
        description="how a region's spot price follows its utilisation (floor, knee, peak, "
        "interval_s); give every broker the same (docs/placement.md, Spot prices)",
    )
    down_after_missed: AtLeastOne = Field(
        default=3, description="missed heartbeats after which a worker is down"
    )
    placement: PlacementDefaults = Field(
        default_factory=PlacementDefaults,
        description="the placement policy of a create that names none (a create's `placement` "
        "is laid over it); see docs/placement.md",
    )
    candidates_from: Literal["book", "offers"] = Field(
        default="book",
        description="where a placement finds its candidates: `book` draws them from what the "
        "broker knows of every worker (heartbeats and usage messages; nobody is asked, a stale "
        "entry costs a refused claim), `offers` asks the workers for fresh offers every time",
    )
    sample_above: int = Field(
        default=64,
        ge=0,
        description="past this many up workers in a region, ask a random sample for offers",
    )
    sample_factor_d: float = Field(
        default=2.0, ge=1.0, le=64.0, description="Sparrow's d: ask d x m workers for m machines"
    )
    sample_min: AtLeastOne = Field(
        default=8,
        description="consider at least this many workers with room when sampling (drawn from "
        "the book, or asked for offers)",
    )
    batch_offer_timeout_s: Seconds = Field(
        default=2.0,
        description="how long a batch create gathers offers (a bigger order, a longer wait)",
    )
    batch_concurrency: AtLeastOne = Field(
        default=8,
        description="batches placed at once; more wait their turn (a busy broker that took "
        "every batch at once would let their offers and claims time out)",
    )
    batch_admission_timeout_s: Seconds = Field(
        default=15.0, description="how long a batch may wait for its turn (then 503)"
    )
    max_batch: AtLeastOne = Field(
        default=1000, description="most machines one batch create may ask for"
    )
    view_sync_interval_s: Seconds = Field(
        default=5.0,
        description="how often the cluster view compares digests with every worker (anti-entropy)",
    )
    events_buffer: AtLeastOne = Field(
        default=10_000, description="events kept for `GET /v1/events` to resume from"
    )
    header_timeout_s: Seconds = Field(
        default=_HTTP.header_timeout_s,
        description="a request's headers must arrive within this (from the connection's "
        "opening or the request's first byte); then 408 and the connection is closed",
    )
    body_grace_s: Seconds = Field(
        default=_HTTP.body_grace_s,
        description="a body must arrive within this after its headers, plus a second per "
        "`body_min_rate` bytes received",
    )
    body_min_rate: AtLeastOne = Field(default=_HTTP.body_min_rate, description="bytes/s")
    write_stall_s: Seconds = Field(
        default=_HTTP.write_stall_s,
        description="a client that reads nothing sent to it for this long is dropped",
    )
    streams_per_client: AtLeastOne = Field(
        default=_HTTP.streams_per_client,
        description="event and log streams one client address may hold open (then 429)",
    )
    streams_total: AtLeastOne = Field(
        default=_HTTP.streams_total, description="event and log streams open at once (then 429)"
    )

    @property
    def http_limits(self) -> HttpLimits:
        """The deadlines and caps of the broker's HTTP connections (souq.http_guard)."""
        return copy_fields(HttpLimits, self)
