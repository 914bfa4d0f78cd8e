"""The placement record: why a machine landed where it did (or could not land at all)."""

from __future__ import annotations

from pydantic import Field

from souq.model.base import Record

__all__ = [
    "ClaimAttempt",
    "ImagePull",
    "OfferOutcome",
    "Placement",
    "PreemptedMachine",
    "Preemption",
    "Sampling",
    "Timings",
]


class OfferOutcome(Record):
    """One worker's offer as the pipeline saw it: rejected with a reason, or scored per stage."""

    worker_id: str
    rejected: str | None = Field(default=None, description="reason code when filtered out")
    detail: str | None = Field(default=None, description="human words for the rejection")
    scores: dict[str, float] = Field(default_factory=dict, description="score per stage")
    score: float | None = Field(default=None, description="final score, when not rejected")
    gpu_free: list[int] | None = Field(
        default=None,
        description="a machine that asks for GPUs: the worker's free thousandths per GPU, by "
        "index, as placement saw them",
    )
    preempts: int | None = Field(
        default=None,
        description="a create that may displace machines: how many this worker would displace "
        "to take it (0: it has the room)",
    )


class ClaimAttempt(Record):
    worker_id: str
    ok: bool
    reason: str | None = None


class Timings(Record):
    gather_ms: float = 0.0
    rank_ms: float = 0.0
    claim_ms: float = 0.0
    total_ms: float = 0.0


class Sampling(Record):
    """The broker considered a random sample of the region's workers instead of all of them."""

    asked: int = Field(
        description="workers considered (asked for an offer, or drawn from the book)"
    )
    of: int = Field(description="live workers of the region")
    seed: str = Field(description="the sample is seeded with this (the request id)")


class ImagePull(Record):
    """The machine's image on the worker that took it: cached there already, or pulled."""

    reference: str = Field(description="sha256:… of the image")
    source: str | None = Field(
        default=None, description="the registry its layers come from (none: the cluster's store)"
    )
    layers: int = Field(description="layers of the image")
    layers_cached: int = Field(description="of them, held by the worker when it took the machine")
    bytes_to_pull: int = Field(description="what the worker had to fetch (0: cached)")
    bytes_pulled: int | None = Field(default=None, description="fetched, once the pull is done")
    pull_ms: float | None = Field(default=None, description="how long fetching and unpacking took")


class PreemptedMachine(Record):
    """A machine a create displaced: stopped (its stop signal, then its kill timeout) and its
    reservation given to the new machine."""

    machine_id: str
    app: str
    priority_class: str
    max_price: float | None = None
    cpus: float
    memory_mb: int
    running: bool = Field(description="whether it was running (else: stopped, holding room)")
    reason: str = Field(description="why it was displaced, in words")


class Preemption(Record):
    """Why a create looked at displacing machines, and what it was allowed to."""

    priority_class: str = Field(description="the create's class")
    displaces: list[str] = Field(description="the classes it may displace")
    max_victims: int = Field(description="the most machines it may displace")
    reason: str = Field(description="why: no worker had room for it as it was")


class Placement(Record):
    request_id: str
    region: str
    region_chosen: str | None = Field(
        default=None, description="why this region, when the create named none"
    )
    policy: str = "best-fit"
    weights: dict[str, float] = Field(
        default_factory=dict, description="weight per scorer (the final score is their mean)"
    )
    unmet: dict[str, list[str]] = Field(
        default_factory=dict,
        description="per rejection reason, what the request asked that workers did not meet, "
        'e.g. {"constraint": ["label.disk = ssd"]}',
    )
    expected_offers: int = Field(default=0, description="live workers of the region asked")
    offers_received: int = 0
    rejections: dict[str, int] = Field(default_factory=dict, description="count per reason")
    offers: list[OfferOutcome] = Field(default_factory=list, description="best first")
    winner: str | None = None
    runner_up: str | None = None
    claims: list[ClaimAttempt] = Field(default_factory=list)
    timings: Timings = Field(default_factory=Timings)
    sampled: Sampling | None = Field(
        default=None, description="set when only a random sample of the workers was asked"
    )
    cached: bool | None = Field(
        default=None,
        description="whether the machine's image was cached on the chosen worker (no image: "
        "null); the worker says so when it takes the machine",
    )
    image: ImagePull | None = Field(default=None, description="the image: cached, or pulled")
    driver: str | None = Field(
        default=None,
        description="the driver it runs under on the chosen worker (`sandbox`: isolated; "
        "`exec`: a plain process), as the worker took it",
    )
    isolation: str | None = Field(
        default=None,
        description="why it is not isolated, when the config left the driver to the worker and "
        "the worker cannot isolate",
    )
    preemption: Preemption | None = Field(
        default=None,
        description="set when no worker had room and the create looked at displacing machines "
        "of a lower priority class",
    )
    preempted: list[PreemptedMachine] = Field(
        default_factory=list, description="the machines it displaced, on the chosen worker"
    )
    source: str = Field(
        default="offers",
        description="where the candidates came from: `book` (the broker's book of what every "
        "worker has promised, kept fresh by their usage messages; no worker asked) or `offers` "
        "(offers asked of the workers)",
    )
