"""A reader of the cluster view through a NATS outage (the broker, a cluster's name server):
refuse at once while the bus is down, recover by itself.

* **Down** (:meth:`BusGuard.lost`, the transport's ``on_disconnect``): every use case that needs
  the bus fails at once with :func:`souq.bus.bus_unavailable` (503 ``unavailable``), checked by
  :meth:`BusGuard.require` before anything is sent; requests already waiting are cut short by
  the transport. The worker table is frozen: the broker's deafness is no worker's death.
* **Back** (:meth:`BusGuard.back`, ``on_reconnect``): the table resumes, the cluster view is
  re-synced, and every worker is asked to announce itself. Until each worker that was live has
  answered (or ``rejoin_timeout_s`` passed) the broker still answers 503, saying it is
  *rejoining*: a placement made before the workers are back would see too few offers and answer
  a misleading ``insufficient_capacity``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from souq.bus import Transport, bus_unavailable
from souq.daemon import cancel_tasks
from souq.errors import SouqError, Unavailable
from souq.view import ClusterView
from souq.view.liveness import Liveness

__all__ = ["BusGuard"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class BusGuard:
    transport: Transport
    liveness: Liveness
    view: ClusterView
    _: KW_ONLY
    rejoin_timeout_s: float
    outages: int = field(default=0, init=False)  # times the bus was lost (for metrics and tests)
    _rejoining: asyncio.Task[None] | None = field(default=None, init=False)
    _hooks: list[tuple[list[Callable[[], Any]], Callable[[], Any]]] = field(
        default_factory=list, init=False
    )

    def install(self) -> None:
        """Hook :meth:`lost` and :meth:`back` to a transport that can lose its connection."""
        for name, hook in (("on_disconnect", self.lost), ("on_reconnect", self.back)):
            hooks = getattr(self.transport, name, None)
            if isinstance(hooks, list):
                hooks.append(hook)
                self._hooks.append((hooks, hook))

    @property
    def rejoining(self) -> bool:
        return self._rejoining is not None and not self._rejoining.done()

    def require(self) -> None:
        """Raise :class:`Unavailable` unless the bus is up and the workers are back on it."""
        if not self.transport.connected:
            raise bus_unavailable()
        if self.rejoining:
            raise Unavailable(
                "the broker is back on the message bus (NATS) and waiting for its workers to "
                "announce themselves; retry shortly",
                hint=f"this takes at most {self.rejoin_timeout_s:g}s after an outage",
            )

    def lost(self) -> None:
        self.outages += 1
        log.warning("the bus is down: answering 503 unavailable until it is back")
        self.liveness.pause()
        self._cancel_rejoin()

    async def back(self) -> None:
        log.warning("the bus is back: re-syncing the worker table and the cluster view")
        self.liveness.resume()
        await self.view.resync()
        self._cancel_rejoin()
        self._rejoining = asyncio.get_running_loop().create_task(
            self._rejoin(), name="souq-broker-rejoin"
        )

    async def _rejoin(self) -> None:
        try:
            await self.liveness.refresh(timeout=self.rejoin_timeout_s)
        except SouqError as exc:  # lost again: the next reconnection starts over
            log.info("rejoining the bus failed: %s", exc)
            return
        log.warning("back on the bus: %d workers live", self.liveness.live_count())

    def _cancel_rejoin(self) -> None:
        if self._rejoining is not None and not self._rejoining.done():
            self._rejoining.cancel()
        self._rejoining = None

    async def close(self) -> None:
        for hooks, hook in self._hooks:
            with contextlib.suppress(ValueError):
                hooks.remove(hook)
        self._hooks = []
        task, self._rejoining = self._rejoining, None
        if task is not None and not task.done():
            await cancel_tasks([task])
