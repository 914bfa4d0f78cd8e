"""What the API shows of an app's secret: never its value (see :mod:`souq.secrets`); what a
create or an update tells the worker about its app's secrets."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, computed_field

__all__ = ["MinSecretsVersion", "SecretInfo", "SkipSecrets"]

# A claim's, a batch claim's and an update's: whether the machine starts without its app's
# secrets, and the version of them the worker must have read before it takes the message.
SkipSecrets = Annotated[
    bool, Field(description="start it without its app's secrets, now and at every later start")
]
MinSecretsVersion = Annotated[
    int,
    Field(ge=0, description="the worker takes it once it has read the app's secrets this far"),
]


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
