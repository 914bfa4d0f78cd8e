"""The parts of a machine's config that stand alone: its size (``guest``), its restart policy and
how it is stopped (``stop_config``), with the signal names they take. Re-exported by
:mod:`souq.model.machine`, where the config that holds them is."""

from __future__ import annotations

import signal as _signal
from typing import Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from souq.model.base import Input, copy_fields
from souq.model.choices import RestartPolicy
from souq.model.durations import format_go_duration, seconds_of, set_timeout_s
from souq.model.fly_fields import GUEST_UNSUPPORTED, drop_unset
from souq.model.resources import GPU_MILLI, Resources

__all__ = ["GuestConfig", "RestartConfig", "StopConfig", "normalise_signal"]


def normalise_signal(value: str | int) -> str:
    """``"term"``, ``"SIGTERM"`` and ``15`` all become ``"SIGTERM"``; anything else is an error."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return _signal.Signals(value).name
        except ValueError:
            raise ValueError(f"unknown signal number {value}") from None
    text = str(value).strip().upper()
    if text.isdigit():
        return normalise_signal(int(text))
    name = text if text.startswith("SIG") else "SIG" + text
    if name not in _signal.Signals.__members__:
        raise ValueError(f"unknown signal {value!r}; use a name such as SIGINT or SIGTERM")
    return name


class GuestConfig(Input):
    cpu_kind: Literal["shared", "performance"] | None = Field(
        default=None,
        description="Fly's kind of CPU, kept as given: every Souq machine gets `cpus` cores "
        "of its worker's, under a cgroup quota",
    )
    cpus: float = Field(
        default=1,
        ge=0.001,
        le=1024,
        allow_inf_nan=False,
        description="CPU cores, fractions down to 0.001 (a thousandth is the smallest share)",
    )
    memory_mb: int = Field(default=256, gt=0, le=16 * 1024 * 1024, description="Memory in MiB")
    disk_mb: int = Field(default=0, ge=0, le=1024 * 1024 * 1024, description="Disk in MiB")
    gpus: int = Field(default=0, ge=0, le=1024, description="Whole GPUs")
    gpu_milli: int = Field(
        default=0,
        ge=0,
        le=GPU_MILLI,
        description="a share of one GPU in thousandths (1-1000), instead of whole `gpus`",
    )
    gpu_model: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="the GPU model it needs (e.g. `V100M16`); unset: any",
    )

    @model_validator(mode="before")
    @classmethod
    def _fly_fields(cls, data: Any) -> Any:
        data = drop_unset(data, GUEST_UNSUPPORTED)
        if isinstance(data, dict) and "gpu_kind" in data:  # Fly's name for the GPU model
            data = dict(data)
            kind = data.pop("gpu_kind")
            if kind:
                if data.get("gpu_model") not in (None, kind):
                    raise ValueError("guest: gpu_kind and gpu_model disagree; give one")
                data["gpu_model"] = kind
        return data

    @field_serializer("cpus")
    def _whole_cpus(self, cpus: float) -> float | int:
        # A whole number is written as one: Fly's client reads `cpus` into an integer.
        return int(cpus) if float(cpus).is_integer() else cpus

    @model_validator(mode="after")
    def _gpu_request(self) -> GuestConfig:
        if self.gpu_milli and self.gpus:
            raise ValueError(
                "gpu_milli: a share of one GPU is asked without gpus; ask for whole GPUs with "
                f"gpus alone (gpus is {self.gpus}, gpu_milli {self.gpu_milli})"
            )
        if self.gpu_model is not None and not (self.gpus or self.gpu_milli):
            raise ValueError("gpu_model: only with a GPU request (gpus or gpu_milli)")
        return self

    def resources(self) -> Resources:
        return copy_fields(Resources, self)


class RestartConfig(Input):
    policy: RestartPolicy = Field(
        default=RestartPolicy.ON_FAILURE,
        description="`no`, `on-failure` (restart on a non-zero exit) or `always`",
    )
    max_retries: int = Field(
        default=10, ge=0, le=10_000, description="restarts allowed by `on-failure`"
    )


class StopConfig(Input):
    signal: str = Field(default="SIGINT", description="signal sent first on stop")
    timeout_s: float = Field(
        default=5.0, ge=0, le=3600, description="seconds before SIGKILL follows the signal"
    )
    drain_s: float = Field(
        default=0.5,
        ge=0,
        le=3600,
        description="a machine with services: seconds between leaving the proxies' rotation "
        "(it is `stopping`) and the signal, so that no new request meets a stopping process",
    )

    @model_validator(mode="before")
    @classmethod
    def _fly_timeout(cls, data: Any) -> Any:
        # Fly's name and form: `timeout` as a Go duration ("5s", "1m30s").
        if isinstance(data, dict) and "timeout" in data:
            data = dict(data)
            given = data.pop("timeout")
            seconds = data.get("timeout_s")
            if type(seconds) in (int, float) and given == format_go_duration(seconds):
                return data  # what the serializer wrote beside it (a peer's message)
            seconds = None if given is None else seconds_of(given, key="timeout")
            set_timeout_s(data, seconds, where="stop_config: ")
        return data

    @field_validator("signal", mode="before")
    @classmethod
    def _signal(cls, v: Any) -> str:
        return normalise_signal(v)

    @model_serializer(mode="wrap")
    def _with_fly_timeout(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        data["timeout"] = format_go_duration(self.timeout_s)
        return data
