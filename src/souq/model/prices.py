"""A region's spot price: the rule that makes it and one published figure of it.

The rule (:class:`SpotPriceRule`) is the broker's configuration; a figure
(:class:`SpotPrice`) is what a broker publishes in JetStream's ``souq-spot-prices`` bucket,
what ``GET /v1/regions`` shows and what an agent compares its spot machines' bids with. The
arithmetic is :mod:`souq.market.prices`' (pure)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from souq.model.base import Record

__all__ = ["MAX_PRICE", "MaxPrice", "SpotPrice", "SpotPriceRule"]

MAX_PRICE = 1e9  # the largest bid, per hour
# A machine's or a job's bid (``max_price``), per hour, in the unit of the spot price; None bids
# without limit.
MaxPrice = Annotated[float | None, Field(ge=0, le=MAX_PRICE, allow_inf_nan=False)]


class SpotPriceRule(BaseModel):
    """``price = floor * multiplier(used)``: ``used`` is the region's used fraction (the larger
    of cpus and memory promised over what its live workers have); the multiplier is 1 up to
    ``knee`` and rises linearly from there to ``peak`` at a full region."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    floor: float = Field(
        default=0.01,
        ge=0,
        le=1e6,
        allow_inf_nan=False,
        description="the price of an idle region, per hour (the unit of `max_price`)",
    )
    knee: float = Field(
        default=0.5,
        ge=0,
        lt=1,
        description="the used fraction up to which the price stays at `floor`",
    )
    peak: float = Field(
        default=10.0,
        ge=1,
        le=1e6,
        allow_inf_nan=False,
        description="the multiple of `floor` a full region costs",
    )
    interval_s: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="how often a broker works its regions' prices out and publishes a change",
    )

    @model_validator(mode="after")
    def _bounded(self) -> SpotPriceRule:
        if self.floor * self.peak > MAX_PRICE:
            raise ValueError("floor * peak must stay within 1e9 (the largest `max_price`)")
        return self


class SpotPrice(Record):
    """One region's spot price as a broker worked it out and published it."""

    region: str
    price: float = Field(
        description="per hour; a spot machine bidding less is refused or preempted"
    )
    used: float = Field(description="the used fraction the price comes from (0 … 1)")
    cpu_used: float = Field(description="cpus promised over the live workers' cpus")
    memory_used: float = Field(description="memory promised over the live workers' memory")
    at_ms: int = Field(description="when it was worked out (ms since the epoch)")
    versions: int = Field(
        default=0,
        description="the sum of the region's workers' ledger versions it was worked out from: "
        "a broker whose view is older does not overwrite it",
    )
