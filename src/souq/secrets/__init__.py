"""App secrets: sealed at rest (:mod:`souq.secrets.sealed`), kept in JetStream
(:mod:`souq.secrets.store`), redacted from served logs (:mod:`souq.secrets.redact`)."""

from souq.secrets.redact import MARK, redact
from souq.secrets.sealed import Sealed, SecretsKey, check_name, check_values

__all__ = ["MARK", "Sealed", "SecretsKey", "check_name", "check_values", "redact"]
