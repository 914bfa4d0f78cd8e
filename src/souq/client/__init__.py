"""The client side of Souq: the Python client (:class:`SouqClient`), the ``souq`` CLI
(:mod:`souq.client.cli`) and the one module that prints (:mod:`souq.client.render`)."""

from souq.client.api import DEFAULT_API, SouqClient

__all__ = ["DEFAULT_API", "SouqClient"]
