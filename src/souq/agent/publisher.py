"""What the agent tells the cluster without being asked: heartbeats and machine events.

* A :class:`~souq.model.Heartbeat` on ``souq.hb.<region>.<id>`` every interval, at start, on
  ``souq.discover``, on reconnect, and soon after the worker's capacity or state changes
  (:meth:`Publisher.announce`).
* Every machine event on ``souq.evt.<region>.<id>``: the executor puts them in the
  :class:`~souq.agent.outbox.Outbox`; they leave a moment after the reply that made them
  (``EVENTS_LINGER_S``), the events ready at once in one message (a JSON array of them).

NATS outages: events wait in the outbox until the connection is back, then go out in order;
heartbeats are not sent meanwhile. On reconnect the agent announces itself at once with
``reconnects`` one higher, which makes every broker re-list its machines.

When: an agent runs two tasks of its own (heartbeats, events). Many workers in one process (the
hollow fleet) share one :class:`Pacer` instead, which calls :meth:`Publisher.heartbeat` and
:meth:`Publisher.flush` on its own schedule: no task or timer per worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from souq.agent.outbox import Outbox
from souq.agent.stats import AgentStats
from souq.agent.wire import JsonOf, dump, event_json
from souq.bus import subjects
from souq.bus.codec import encode, encode_many
from souq.bus.transport import Transport
from souq.daemon import cancel_tasks
from souq.errors import Unavailable
from souq.model.protocol import MachineEventMessage
from souq.model.worker import Heartbeat, PreemptibleRoom, WorkerInfo, WorkerUsage
from souq.protocol.verbs import PROTOCOL_MINOR

__all__ = ["EVENTS_LINGER_S", "MESSAGE_BYTES", "Pacer", "Publisher"]

log = logging.getLogger(__name__)

# Machine events wait this long after the reply that made them (they also gather: a burst of
# changes goes out in fewer messages). Long enough for the broker to read the reply first.
EVENTS_LINGER_S = 0.002
MESSAGE_BYTES = 256 * 1024  # events per message: up to this size (NATS allows 1 MiB)


class Pacer(Protocol):
    """A schedule shared by many publishers: it calls :meth:`Publisher.heartbeat` every
    :attr:`Publisher.interval_s` and :meth:`Publisher.flush` ``EVENTS_LINGER_S`` after it was
    told that events wait (:meth:`events_waiting`)."""

    def add(self, publisher: Publisher) -> None: ...

    def remove(self, publisher: Publisher) -> None: ...

    def events_waiting(self, publisher: Publisher) -> None: ...


class Publisher:
    def __init__(
        self,
        transport: Transport,
        outbox: Outbox,
        *,
        region: str,
        worker_id: str,
        interval_s: float,
        worker_info: Callable[[], WorkerInfo],
        usage: Callable[[], WorkerUsage],
        layers: Callable[[], list[str]],
        stats: AgentStats,
        pacer: Pacer | None = None,
        json_of: JsonOf = dump,
    ) -> None:
        """``pacer``: the schedule shared with other workers of the process (the hollow fleet);
        by default the publisher runs its own tasks. ``json_of``: the JSON of a config or a
        placement record, as the store made it (:mod:`souq.agent.wire`)."""
        self._transport = transport
        self._outbox = outbox
        self._worker_id = worker_id
        self._heartbeat_subject = subjects.heartbeat(region, worker_id)
        self._usage_subject = subjects.usage(region, worker_id)
        self._events_subject = subjects.events(region, worker_id)
        self._interval = interval_s
        self._worker_info = worker_info
        self._usage = usage
        self._layers = layers
        # The ledger version and what lower classes could free, as last told (heartbeats tell
        # them too).
        self._usage_sent: tuple[int, list[PreemptibleRoom] | None] = (-1, None)
        self._stats = stats
        self._seq = 0
        self.reconnects = 0  # times the bus came back (sent in heartbeats)
        self._bus_up = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._hooks: list[tuple[list[Callable[[], Any]], Callable[[], Any]]] = []
        self._announcing: asyncio.Task[None] | None = None
        self._pacer = pacer
        self._json_of = json_of

    @property
    def interval_s(self) -> float:
        return self._interval

    async def start(self) -> None:
        t = self._transport
        for name, hook in (("on_disconnect", self._bus_lost), ("on_reconnect", self._bus_back)):
            hooks = getattr(t, name, None)
            if isinstance(hooks, list):  # NATS: keep events during an outage, then announce
                hooks.append(hook)
                self._hooks.append((hooks, hook))
        if t.connected:
            self._bus_up.set()
        if self._pacer is not None:
            self._pacer.add(self)
            self._outbox.listen(self._events_waiting)
            if self._outbox:
                self._events_waiting()
            return
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._publish_events(), name="souq-agent-events"),
            loop.create_task(self._heartbeats(), name="souq-agent-heartbeat"),
        ]

    def unhook(self) -> None:
        """Stop following the bus's outages (at shutdown)."""
        for hooks, hook in self._hooks:
            with contextlib.suppress(ValueError):
                hooks.remove(hook)
        self._hooks = []

    async def aclose(self) -> None:
        self.unhook()
        if self._pacer is not None:
            self._pacer.remove(self)
            self._outbox.listen(None)
        await cancel_tasks(self._tasks)
        self._tasks = []
        if self._transport.connected:
            await self._send_events()  # events of the shutdown itself
        if self._outbox:
            log.warning(
                "%d machine events not published (the bus is down); the next agent's "
                "announcement makes the brokers re-list this worker",
                len(self._outbox),
            )

    # -- heartbeats ------------------------------------------------------------------------

    async def heartbeat(self) -> None:
        if not self._transport.connected:
            return  # a stale heartbeat buffered through an outage would tell nothing true
        self._seq += 1
        info = self._worker_info()
        beat = Heartbeat(
            worker=info,
            seq=self._seq,
            interval_s=self._interval,
            reconnects=self.reconnects,
            protocol=PROTOCOL_MINOR,
            layers=self._layers(),
        )
        if info.version >= self._usage_sent[0]:
            self._usage_sent = (info.version, info.preemptible)
        try:
            await self._transport.publish(self._heartbeat_subject, encode(beat))
        except Unavailable as exc:
            log.debug("heartbeat not sent: %s", exc)
        else:
            self._stats.last_heartbeat = time.time()

    def announce(self) -> None:
        """Publish a heartbeat soon: the worker's capacity or state just changed."""
        if self._announcing is None or self._announcing.done():
            self._announcing = asyncio.get_running_loop().create_task(self.heartbeat())

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.heartbeat()

    async def _bus_lost(self) -> None:
        self._bus_up.clear()
        log.warning("the bus is down: machines go on, their events wait in the outbox")

    async def _bus_back(self) -> None:
        self.reconnects += 1
        self._bus_up.set()
        log.warning(
            "the bus is back: announcing worker %s, publishing %d held events",
            self._worker_id,
            len(self._outbox),
        )
        await self.heartbeat()
        if self._outbox:
            self._events_waiting()

    # -- machine events --------------------------------------------------------------------

    async def _publish_events(self) -> None:
        while True:
            await self._outbox.wait()
            await self._bus_up.wait()
            # The reply to the claim or command that made these events goes out first, and the
            # events a moment later (EVENTS_LINGER_S): sent at once, they reach the broker
            # with the reply, and it applies them to its view before it reads the reply.
            await asyncio.sleep(EVENTS_LINGER_S)
            await self._send_events()
            await self._send_usage()

    def _events_waiting(self) -> None:
        if self._pacer is not None:
            self._pacer.events_waiting(self)

    async def flush(self) -> None:
        """Send the events waiting in the outbox, then the usage if it changed (what the
        publisher's own task does ``EVENTS_LINGER_S`` after events were queued; a
        :class:`Pacer` calls it). Nothing while the bus is down: the events wait for it."""
        if not self._bus_up.is_set():
            return
        await self._send_events()
        await self._send_usage()

    async def _send_usage(self) -> None:
        """Tell what the worker has promised, if that changed since it was last told: a claim
        or a destroy moves it, and brokers choose workers by it between heartbeats. What lower
        classes could free changes without it too (a machine's create, done, makes it one a
        create of a higher class may displace)."""
        usage = self._usage()
        told = (usage.version, usage.preemptible)
        if told == self._usage_sent or not self._transport.connected:
            return
        try:
            await self._transport.publish(self._usage_subject, encode(usage))
        except Unavailable as exc:
            log.debug("usage not sent: %s", exc)
        else:
            self._usage_sent = told

    async def _send_events(self) -> None:
        """Send what the outbox holds, in order, several events to a message (a claim makes
        three at once; a batch claim hundreds); put back what the bus did not take."""
        batch = self._outbox.take()
        subject = self._events_subject
        at = 0
        for size, payload in _event_messages(batch, self._json_of):
            if not self._transport.connected and self._hooks:
                self._bus_up.clear()  # the reconnect hook sets it again
                self._outbox.put_back(batch[at:])
                return
            try:
                await self._transport.publish(subject, payload)
            except Unavailable as exc:
                if self._transport.connected or not self._hooks:  # not an outage: skip it
                    log.warning("%d machine events not published: %s", size, exc)
                    at += size
                    continue
                self._bus_up.clear()
                self._outbox.put_back(batch[at:])
                return
            at += size


def _event_messages(
    batch: list[MachineEventMessage], json_of: JsonOf = dump
) -> Iterator[tuple[int, bytes]]:
    """``batch`` as messages of consecutive events: ``(how many, payload)``, each payload one
    event or a JSON array of several (:func:`souq.bus.codec.encode_many`)."""
    group: list[bytes] = []
    size = 0
    for msg in batch:
        data = event_json(msg, json_of)
        if group and size + len(data) > MESSAGE_BYTES:
            yield len(group), group[0] if len(group) == 1 else encode_many(group)
            group, size = [], 0
        group.append(data)
        size += len(data) + 1
    if group:
        yield len(group), group[0] if len(group) == 1 else encode_many(group)
