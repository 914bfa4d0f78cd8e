"""Resources: what a machine asks for and what a worker has. CPU is accounted in millicores so that
sums are exact; disk and GPUs default to zero, so a peer that does not know them reads as having
none and a machine that asks for none fits anywhere."""

from __future__ import annotations

from functools import cached_property

from pydantic import Field

from souq.model.base import Input

__all__ = ["Resources"]


class Resources(Input):
    cpus: float = Field(ge=0, description="CPU cores; fractions are allowed down to 0.001")
    memory_mb: int = Field(ge=0, description="Memory in MiB")
    disk_mb: int = Field(default=0, ge=0, description="Disk in MiB")
    gpus: int = Field(default=0, ge=0, description="Whole GPUs")

    @cached_property
    def millicpus(self) -> int:
        return round(self.cpus * 1000)

    def plus(self, other: Resources) -> Resources:
        return Resources(
            cpus=(self.millicpus + other.millicpus) / 1000,
            memory_mb=self.memory_mb + other.memory_mb,
            disk_mb=self.disk_mb + other.disk_mb,
            gpus=self.gpus + other.gpus,
        )

    def minus(self, other: Resources) -> Resources:
        return Resources.model_construct(  # may go negative: a shortfall, not an input
            cpus=(self.millicpus - other.millicpus) / 1000,
            memory_mb=self.memory_mb - other.memory_mb,
            disk_mb=self.disk_mb - other.disk_mb,
            gpus=self.gpus - other.gpus,
        )

    def fits_within(self, capacity: Resources) -> bool:
        return (
            self.millicpus <= capacity.millicpus
            and self.memory_mb <= capacity.memory_mb
            and self.disk_mb <= capacity.disk_mb
            and self.gpus <= capacity.gpus
        )

    @classmethod
    def zero(cls) -> Resources:
        return cls(cpus=0, memory_mb=0)
