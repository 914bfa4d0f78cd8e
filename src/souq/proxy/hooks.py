"""What the relay asks of the control plane: the hook interface, and a version that does nothing.

The relay calls a :class:`ProxyHooks` at two points and nowhere else:

``await wake(app, region)``
    :meth:`RoutingTable.claim` found no machine of ``app`` that serves, and the app has one that
    may be started (``autostart``, stopped or suspended). Start one (the nearest to ``region``),
    put it in the table as ``started`` (``upsert``), and return it; or return None when nothing
    could be started. The relay shares one call between the requests of one app that arrive
    while it runs, never cancels it (a request whose deadline passes stops waiting, the call
    goes on), and also calls it, without waiting, when every serving machine of the app is past
    its soft limit (Fly's autostart). The control plane may share calls further (across
    listeners, or per machine).

``on_request_done(app, backend, status, seconds)``
    Called once per request answered, on the hot path: keep it to a few attribute updates.
    ``backend`` is None when no machine was involved (an error the proxy answered itself);
    ``status`` is the status sent to the client (101 for an upgrade, 499 when the client went
    away first); ``seconds`` runs from the request's head to the end of its answer.
"""

from __future__ import annotations

from typing import Protocol

from souq.proxy.table import Backend

__all__ = ["NoHooks", "ProxyHooks"]


class ProxyHooks(Protocol):
    async def wake(self, app: str, region: str | None) -> Backend | None: ...

    def on_request_done(
        self, app: str, backend: Backend | None, status: int, seconds: float
    ) -> None: ...


class NoHooks:
    """Wakes nothing and records nothing: a proxy over a fixed table."""

    async def wake(self, app: str, region: str | None) -> Backend | None:
        return None

    def on_request_done(
        self, app: str, backend: Backend | None, status: int, seconds: float
    ) -> None:
        return None
