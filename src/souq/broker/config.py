"""The broker's configuration: typed, frozen, validated, unknown keys rejected."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["BrokerConfig"]


class BrokerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    nats_url: str = Field(description="NATS server to join, e.g. nats://127.0.0.1:4222")
    nats_connect_timeout_s: float = Field(
        default=5.0, gt=0, description="the first connection to NATS must succeed within this"
    )
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(default=4280, ge=0, le=65535, description="0 picks a free port")
    offer_timeout_s: float = Field(
        default=0.3, gt=0, description="how long to gather offers from a region's workers"
    )
    claim_timeout_s: float = Field(default=5.0, gt=0, description="how long one claim may take")
    command_timeout_s: float = Field(
        default=10.0, gt=0, description="how long a worker may take to answer a command"
    )
    gather_timeout_s: float = Field(
        default=2.0, gt=0, description="how long to gather list and locate answers"
    )
    max_claim_attempts: int = Field(
        default=3, ge=1, description="claims tried, best offer first, before giving up"
    )
    down_after_missed: int = Field(
        default=3, ge=1, description="missed heartbeats after which a worker is down"
    )
