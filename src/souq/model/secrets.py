"""What the API shows of an app's secret: never its value (see :mod:`souq.secrets`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, computed_field

__all__ = ["SecretInfo"]


class SecretInfo(BaseModel):
    """A secret's name, a short digest of its value, when it was set."""

    model_config = ConfigDict(frozen=True)

    name: str
    digest: str = Field(description="a keyed digest of the value: it changes when the value does")
    set_at: str = Field(description="when the value was set (ISO 8601, UTC)")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def updated_at(self) -> str:
        """Fly's name for ``set_at``."""
        return self.set_at
