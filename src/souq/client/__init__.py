"""The client side of Souq: the Python client (:class:`SouqClient`), the ``souq`` CLI
(:mod:`souq.client.cli`) and the one module that prints (:mod:`souq.client.render`).

The client (and httpx with it) is imported on first use, so that the daemons the CLI starts
(``souq agent``, ``souq broker``) do not load it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from souq.client.api import DEFAULT_API, SouqClient

__all__ = ["DEFAULT_API", "SouqClient"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from souq.client import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
