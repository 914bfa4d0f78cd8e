"""The HTTP API's own bodies: what a caller sends, and the error and health answers. Machines,
workers and events are the models of :mod:`souq.model`."""

from __future__ import annotations

import re
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    computed_field,
    field_validator,
    model_validator,
)

from souq.model import (
    APP_NAME_PATTERN,
    Input,
    Machine,
    MachineConfig,
    Placement,
    WorkerState,
    normalise_signal,
)
from souq.model.durations import seconds_of, set_timeout_s
from souq.model.fly_fields import CREATE_UNSUPPORTED, FlyInput
from souq.model.machine import validate_name
from souq.model.policy import PlacementPolicy

__all__ = [
    "REGION_PATTERN",
    "CreateMachineRequest",
    "DryRun",
    "ErrorBody",
    "Health",
    "ListedMachine",
    "QuoteRequest",
    "SignalRequest",
    "StopRequest",
    "check_app_name",
]

REGION_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # as the agent accepts
_APP = re.compile(APP_NAME_PATTERN)


def check_app_name(app: str) -> str | None:
    """Why ``app`` is not a valid app name, or None when it is."""
    if _APP.match(app):
        return None
    return (
        f"app name {app!r} is not valid: use 1-63 lowercase letters, digits and '-', "
        "starting with a letter or digit"
    )


class FlyLaunchFields(FlyInput):
    """What Fly's create and update bodies (``LaunchMachineInput``) carry beside the config:
    the fields Souq takes, and the ones it refuses when set (naming why)."""

    unsupported = CREATE_UNSUPPORTED
    skip_secrets: bool = Field(
        default=False,
        description="give the machine none of its app's secrets, at this start and every later "
        "one; a token that may not read the app's secrets (below deploy) always makes such a "
        "machine",
    )
    lease_ttl: int | None = Field(
        default=None,
        ge=1,
        le=3600,
        description="lease the machine for this many seconds once made or updated (its nonce "
        "in the answer's `nonce`)",
    )
    min_secrets_version: int | None = Field(
        default=None,
        ge=0,
        description="Fly's: start the machine with the app's secrets as of this version or "
        "later (a broker asks at least for the last version it wrote itself)",
    )


class CreateMachineRequest(FlyLaunchFields):
    """``POST /v1/apps/{app}/machines``."""

    name: str | None = Field(default=None, description="defaults to a generated name")
    region: str | None = Field(
        default=None,
        pattern=REGION_PATTERN,
        description="where to place the machine (default: where most of the app's machines "
        "are, else the region where most machines of this size fit)",
    )
    skip_launch: bool = Field(default=False, description="create it, but do not start it")
    config: MachineConfig
    quote: str | None = Field(
        default=None, description="a quote id: use exactly the capacity that quote holds"
    )
    placement: PlacementPolicy | None = Field(
        default=None, description="how to rank the workers' offers (over the broker's default)"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return validate_name(v)


class QuoteRequest(Input):
    """``POST /v1/apps/{app}/quotes``: hold capacity for a machine like ``config``."""

    region: str = Field(pattern=REGION_PATTERN, description="where to hold the capacity")
    ttl_s: float = Field(default=10.0, gt=0, le=3600, description="how long the hold lasts")
    config: MachineConfig
    placement: PlacementPolicy | None = Field(
        default=None, description="how to rank the offers (see docs/placement.md)"
    )


class UpdateMachineRequest(FlyLaunchFields):
    """``POST /v1/apps/{app}/machines/{id}``: the machine's new config (it stays on its
    worker; a started machine restarts with it)."""

    config: MachineConfig
    skip_launch: bool = Field(default=False, description="a stopped machine stays stopped")
    region: str | None = Field(
        default=None, pattern=REGION_PATTERN, description="if given, the machine's own"
    )
    name: str | None = Field(default=None, description="if given, the machine's own")


class LeaseBody(Input):
    """``POST .../lease`` (the body is optional)."""

    ttl: float = Field(default=30.0, gt=0, le=3600, description="seconds the lease lasts")
    description: str = Field(default="", max_length=256, description="who holds it, and why")


def fly_stop_timeout(given: Any) -> float | None:
    """Fly's grace before SIGKILL, in seconds; ``"0s"`` (what Fly's client sends when none is
    given) is None: the machine's own stop config."""
    return seconds_of(given, key="timeout") or None


class StopRequest(Input):
    """``POST .../stop`` and ``.../restart`` (the body is optional). Fly's body also works:
    ``{"id": ..., "signal": ..., "timeout": "5s"}`` (``"0s"``, as Fly's client sends when none
    is given, means the machine's own)."""

    signal: str | None = Field(default=None, description="defaults to the machine's stop signal")
    timeout_s: float | None = Field(
        default=None, ge=0, le=3600, description="seconds before SIGKILL follows the signal"
    )

    @model_validator(mode="before")
    @classmethod
    def _fly_body(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not ({"id", "timeout"} & data.keys()):
            return data
        data = dict(data)
        data.pop("id", None)  # Fly's client names the machine in the body too: the path's wins
        timeout = data.pop("timeout", None)
        set_timeout_s(data, None if timeout is None else fly_stop_timeout(timeout))
        return data

    @field_validator("signal", mode="before")
    @classmethod
    def _signal(cls, v: Any) -> str | None:
        return None if v is None else normalise_signal(v)


class SignalRequest(Input):
    """``POST .../signal``."""

    signal: str = Field(description="a name such as SIGUSR1 or USR1, or a number")

    @field_validator("signal", mode="before")
    @classmethod
    def _signal(cls, v: Any) -> str:
        return normalise_signal(v)


class DryRun(BaseModel):
    """``POST /v1/apps/{app}/machines?dry_run=true``: where the machine would go, and why."""

    dry_run: bool = True
    placement: Placement


class ErrorBody(BaseModel):
    """Every error answer. More keys may follow (e.g. ``placement`` with
    ``insufficient_capacity``)."""

    model_config = ConfigDict(extra="allow")

    error: str = Field(description="what went wrong, in words")
    status: str = Field(description="a stable machine-readable code, e.g. not_found")
    hint: str | None = Field(default=None, description="what to do about it")


class Health(BaseModel):
    status: str = "ok"
    nats: str = "connected"
    nats_server: str = Field(
        default="", description="HOST:PORT of the NATS server (of a cluster's) it is connected to"
    )
    workers: int = Field(description="live workers known to this broker")


class ListedMachine(Machine):
    """A machine as a list shows it: with the state of the worker holding it, as this broker
    sees it now (a machine on a ``down`` worker keeps the last state its worker reported)."""

    worker_state: WorkerState

    @computed_field  # type: ignore[prop-decorator]
    @property
    def host_status(self) -> str:
        """Fly's: ``unreachable`` while its worker is down, else ``ok``."""
        return "unreachable" if self.worker_state is WorkerState.DOWN else "ok"
