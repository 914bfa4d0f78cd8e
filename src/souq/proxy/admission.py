"""Getting a request a machine when the table has none free: the queue, the wake-ups, drains.

:meth:`Admission.claim` loops until a machine takes the request or its deadline passes:

* every serving machine is at its hard limit (``FULL``) or one is on its way to started
  (``PENDING``): wait in the app's queue (first in, first out, ``queue_limit`` long) until a
  request finishes or the table changes;
* nothing serves but a machine can be started (``WAKEABLE``): ask the control plane
  (:meth:`ProxyHooks.wake`), one call shared by every request of the app that waits meanwhile,
  never cancelled by a request that stops waiting;
* the app is unknown, or nothing of it can serve: wait up to :data:`VIEW_LAG_S` for news of it
  (the view may not have heard of a machine just made: its event is on its way), then answer.

While an app has requests queued, new requests of that app queue behind them
(:meth:`Admission.try_claim`), so that a freed machine goes to the oldest. Every serving machine
past its soft limit makes a background wake-up (at most one a second per app), which is how
Fly's proxy starts a stopped machine before the running ones are full.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import KW_ONLY, dataclass, field

from souq.proxy.errors import AppNotFound, NoMachines
from souq.proxy.hooks import ProxyHooks
from souq.proxy.table import Availability, Backend, RoutingTable, Slot

__all__ = ["VIEW_LAG_S", "Admission"]

log = logging.getLogger(__name__)

_SOFT_WAKE_EVERY_S = 1.0
VIEW_LAG_S = 1.0  # how long an unknown app, or one with nothing to serve, waits for news of it


@dataclass(eq=False)
class Admission:
    table: RoutingTable
    hooks: ProxyHooks
    _: KW_ONLY
    region: str | None
    queue_limit: int
    timeout_s: float
    waiters: dict[str, deque[asyncio.Future[None]]] = field(default_factory=dict, init=False)
    _waking: dict[tuple[str, str | None], asyncio.Task[Backend | None]] = field(
        default_factory=dict, init=False
    )
    _soft_woken: dict[str, float] = field(default_factory=dict, init=False)
    _drains: dict[str, list[asyncio.Future[None]]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.table.subscribe(self._changed)

    # -- the hot path ------------------------------------------------------------------------------

    def try_claim(self, app: str) -> Slot | None:
        """A machine for a new request at once, or None (then :meth:`claim` it)."""
        if self.waiters and app in self.waiters:
            return None
        slot = self.table.claim(app, self.region)
        if slot is not None and slot.load > slot.soft:
            self._over_soft_limit(app)
        return slot

    def release(self, slot: Slot) -> None:
        """A request (or connection) on ``slot`` is over."""
        slot.load -= 1
        if self.waiters:
            queue = self.waiters.get(slot.backend.app)
            while queue:
                fut = queue.popleft()
                if not fut.done():
                    fut.set_result(None)
                    break
        if slot.draining and slot.load <= 0 and self._drains:
            for fut in self._drains.pop(slot.machine_id, ()):
                if not fut.done():
                    fut.set_result(None)

    # -- the slow path -----------------------------------------------------------------------------

    async def claim(self, app: str, deadline: float) -> Slot:
        """Wait for a machine of ``app`` until ``deadline`` (on the loop's clock); raises
        :class:`AppNotFound` or :class:`NoMachines`."""
        loop = asyncio.get_running_loop()
        table = self.table
        woke = False
        news_until = loop.time() + VIEW_LAG_S
        while True:
            slot = table.claim(app, self.region)
            if slot is not None:
                if slot.load > slot.soft:
                    self._over_soft_limit(app)
                return slot
            state = table.availability(app)
            if state in (Availability.UNKNOWN, Availability.NONE):
                # The view may not have the app's new machine yet (its event is on its way):
                # a moment for news of the app, then the answer.
                wait = min(news_until, deadline) - loop.time()
                if wait > 0 and await self._news(app, wait):
                    continue
            if state is Availability.UNKNOWN:
                raise AppNotFound.named(app)
            if state is Availability.NONE:
                raise NoMachines(
                    f"app {app} has no machine that can serve: none is started and none can be "
                    "started",
                    hint="start a machine, or set autostart on its service",
                )
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self._late(app)
            if state is Availability.WAKEABLE and not woke:
                woke = True
                backend = await self._wake(app, remaining)
                if backend is None and table.availability(app) is Availability.WAKEABLE:
                    raise NoMachines(f"app {app} has no started machine and none could be started")
                continue
            if state is Availability.FULL and not woke and table.wakeable(app):
                woke = True
                self._start_wake(app)
            await self._wait(app, remaining)

    async def wait_drained(self, machine_id: str, timeout: float) -> bool:
        """Until the draining machine's last request or connection is over; False on timeout."""
        if self.table.load(machine_id) <= 0:
            return True
        fut = asyncio.get_running_loop().create_future()
        self._drains.setdefault(machine_id, []).append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            return False
        return True

    def queued(self) -> dict[str, int]:
        return {app: sum(not f.done() for f in q) for app, q in self.waiters.items() if q}

    def close(self) -> None:
        for task in list(self._waking.values()):
            task.cancel()
        for queue in self.waiters.values():
            for fut in queue:
                fut.cancel()

    # -- inside ------------------------------------------------------------------------------------

    def _late(self, app: str) -> NoMachines:
        return NoMachines(
            f"no machine of app {app} could take the request within {self.timeout_s:g}s",
            hint="every machine is at its hard limit or failing its health checks, or none "
            "could be started in time",
        )

    async def _wait(self, app: str, remaining: float) -> None:
        if not await self._news(app, remaining):
            raise self._late(app)

    async def _news(self, app: str, timeout: float) -> bool:
        """Until the table changes for ``app`` or a slot of it frees (True), or ``timeout``
        passes (False): in the app's queue, first in, first out."""
        queue = self.waiters.get(app)
        if queue is None:
            queue = self.waiters[app] = deque()
        if len(queue) >= self.queue_limit:
            raise NoMachines(
                f"app {app} has {len(queue)} requests waiting for a machine already",
                hint="every machine is at its hard limit: add machines or raise the limits",
            )
        fut = asyncio.get_running_loop().create_future()
        queue.append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            return False
        finally:
            with contextlib.suppress(ValueError):
                queue.remove(fut)
            if not queue and self.waiters.get(app) is queue:
                del self.waiters[app]
        return True

    def _start_wake(self, app: str) -> asyncio.Task[Backend | None]:
        key = (app, self.region)
        task = self._waking.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self.hooks.wake(app, self.region))
            self._waking[key] = task
            task.add_done_callback(lambda t: self._woken(key, t))
        return task

    async def _wake(self, app: str, remaining: float) -> Backend | None:
        task = self._start_wake(app)
        done, _ = await asyncio.wait((task,), timeout=remaining)
        if not done:
            raise self._late(app)
        if task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    def _woken(self, key: tuple[str, str | None], task: asyncio.Task[Backend | None]) -> None:
        if self._waking.get(key) is task:
            del self._waking[key]
        if not task.cancelled() and (err := task.exception()) is not None:
            log.warning("waking a machine of app %s failed: %r", key[0], err)

    def _over_soft_limit(self, app: str) -> None:
        now = asyncio.get_running_loop().time()
        if now - self._soft_woken.get(app, -_SOFT_WAKE_EVERY_S) < _SOFT_WAKE_EVERY_S:
            return
        self._soft_woken[app] = now
        if self.table.wakeable(app):
            self._start_wake(app)

    def _changed(self, app: str) -> None:
        """The table changed for ``app``: every waiter of it looks again."""
        queue = self.waiters.get(app)
        if queue:
            for fut in queue:
                if not fut.done():
                    fut.set_result(None)
