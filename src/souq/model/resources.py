"""Resources: what a machine asks for and what a worker has. CPU is accounted in millicores so that
sums are exact."""

from __future__ import annotations

from pydantic import Field

from souq.model.base import Input

__all__ = ["Resources"]


class Resources(Input):
    cpus: float = Field(ge=0, description="CPU cores; fractions are allowed down to 0.001")
    memory_mb: int = Field(ge=0, description="Memory in MiB")

    @property
    def millicpus(self) -> int:
        return round(self.cpus * 1000)

    def plus(self, other: Resources) -> Resources:
        return Resources(
            cpus=(self.millicpus + other.millicpus) / 1000,
            memory_mb=self.memory_mb + other.memory_mb,
        )

    def minus(self, other: Resources) -> Resources:
        return Resources(
            cpus=(self.millicpus - other.millicpus) / 1000,
            memory_mb=self.memory_mb - other.memory_mb,
        )

    def fits_within(self, capacity: Resources) -> bool:
        return self.millicpus <= capacity.millicpus and self.memory_mb <= capacity.memory_mb

    @classmethod
    def zero(cls) -> Resources:
        return cls(cpus=0, memory_mb=0)
