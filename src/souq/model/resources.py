"""Resources: what a machine asks for and what a worker has. CPU is accounted in millicores so that
sums are exact; disk and GPUs default to zero, so a peer that does not know them reads as having
none and a machine that asks for none fits anywhere.

GPUs come whole (``gpus``) or as a share of one GPU in thousandths (``gpu_milli``, a request
gives one or the other). Summed (what a worker's machines reserve), ``gpus`` counts the whole
GPUs and ``gpu_milli`` the shares' thousandths. Which GPU holds what is the worker's per-GPU
state (``WorkerInfo.gpu_free``, :mod:`souq.placement.gpus`), not a sum. ``gpu_model`` is the
model of a worker's GPUs, or the model a request asks for (None: any); sums carry none."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from souq.model.base import Input

__all__ = ["GPU_MILLI", "Resources"]

GPU_MILLI = 1000  # thousandths in one GPU


class Resources(Input):
    cpus: float = Field(ge=0, description="CPU cores; fractions are allowed down to 0.001")
    memory_mb: int = Field(ge=0, description="Memory in MiB")
    disk_mb: int = Field(default=0, ge=0, description="Disk in MiB")
    gpus: int = Field(default=0, ge=0, description="Whole GPUs")
    gpu_milli: int = Field(
        default=0, ge=0, description="A share of one GPU in thousandths (summed: the shares')"
    )
    gpu_model: str | None = Field(
        default=None, description="the GPUs' model: a worker's, or the one a request asks for"
    )

    @model_serializer(mode="wrap")
    def _compact(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A size without GPU shares or a model reads as before they existed.
        out: dict[str, Any] = handler(self)
        if not out.get("gpu_milli"):
            out.pop("gpu_milli", None)
        if out.get("gpu_model") is None:
            out.pop("gpu_model", None)
        return out

    @cached_property
    def millicpus(self) -> int:
        return round(self.cpus * 1000)

    @property
    def wants_gpu(self) -> bool:
        return self.gpus > 0 or self.gpu_milli > 0

    def plus(self, other: Resources) -> Resources:
        return Resources(
            cpus=(self.millicpus + other.millicpus) / 1000,
            memory_mb=self.memory_mb + other.memory_mb,
            disk_mb=self.disk_mb + other.disk_mb,
            gpus=self.gpus + other.gpus,
            gpu_milli=self.gpu_milli + other.gpu_milli,
            gpu_model=self.gpu_model,
        )

    def minus(self, other: Resources) -> Resources:
        return Resources.model_construct(  # may go negative: a shortfall, not an input
            cpus=(self.millicpus - other.millicpus) / 1000,
            memory_mb=self.memory_mb - other.memory_mb,
            disk_mb=self.disk_mb - other.disk_mb,
            gpus=self.gpus - other.gpus,
            gpu_milli=self.gpu_milli - other.gpu_milli,
            gpu_model=self.gpu_model,
        )

    def growth_to(self, new: Resources) -> Resources:
        """What a reservation of this size takes more to become ``new`` (in place: CPU, memory
        and disk; none of them shrinks below nothing)."""
        return Resources(
            cpus=max(0, new.millicpus - self.millicpus) / 1000,
            memory_mb=max(0, new.memory_mb - self.memory_mb),
            disk_mb=max(0, new.disk_mb - self.disk_mb),
        )

    def times(self, count: int) -> Resources:
        """``count`` machines of this size together (a sum: no model)."""
        return Resources(
            cpus=self.millicpus * count / 1000,
            memory_mb=self.memory_mb * count,
            disk_mb=self.disk_mb * count,
            gpus=self.gpus * count,
            gpu_milli=self.gpu_milli * count,
        )

    def fits_within(self, capacity: Resources) -> bool:
        return (
            self.millicpus <= capacity.millicpus
            and self.memory_mb <= capacity.memory_mb
            and self.disk_mb <= capacity.disk_mb
            and self.gpus <= capacity.gpus
            and self.gpu_milli <= capacity.gpu_milli
            and (self.gpu_model is None or self.gpu_model == capacity.gpu_model)
        )

    @classmethod
    def zero(cls) -> Resources:
        return cls(cpus=0, memory_mb=0)
