"""An app's releases: each deploy is one, with its version, its image and its config."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from souq.model.base import Input, Record
from souq.model.choices import Strategy

__all__ = ["NewRelease", "Release", "ReleaseState", "ReleaseUpdate", "Strategy"]


class ReleaseState(StrEnum):
    PENDING = "pending"  # made, its deploy not started
    DEPLOYING = "deploying"
    COMPLETE = "complete"  # live everywhere
    FAILED = "failed"  # a phase failed; the app was rolled back to the last complete release
    ROLLED_BACK = "rolled_back"  # a later rollback left it


class NewRelease(Input):
    """``POST /v1/apps/{app}/releases``."""

    image: str = Field(min_length=1, description="the image reference its machines run")
    config: dict[str, Any] = Field(description="the app config (souq.toml, as JSON)")
    strategy: Strategy = Field(default=Strategy.ROLLING, description="how it is deployed")
    description: str = Field(default="", max_length=512)


class ReleaseUpdate(Input):
    """``POST /v1/apps/{app}/releases/{version}``: its deploy moved on."""

    state: ReleaseState
    reason: str = Field(default="", max_length=4096, description="why it failed, or who did it")


class Release(Record):
    app: str
    version: int = Field(description="1, 2, 3… per app; given by the store, never reused")
    state: ReleaseState
    image: str
    config: dict[str, Any]
    strategy: str
    description: str = ""
    reason: str = ""
    created_at: str
    updated_at: str
