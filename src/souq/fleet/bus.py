"""One NATS connection for every hollow worker of a fleet.

Each hollow worker runs the real :class:`~souq.agent.service.AgentService`, which subscribes to
its own verbs (``souq.worker.<id>.*``) and to the broadcast subjects (``souq.offers.<region>``,
``souq.all.*``, ``souq.discover``). Given a plain transport, N workers would make 5·N NATS
subscriptions, and every broadcast would be delivered N times and spawn N tasks. Instead each
worker gets a :class:`WorkerPort` (a :class:`~souq.bus.transport.Transport`) whose subscriptions
are demultiplexed here:

* one NATS subscription, ``souq.worker.*.*``, routes each verb to its worker by id (a task per
  message, as on an agent: a ``wait`` must not hold up the next message; the verbs that never
  wait, claims and digests first, are answered in the subscription's task);
* one NATS subscription per broadcast subject answers it for every worker in turn, in a single
  task, each reply published to the requester's inbox as it is made.

Publishing (heartbeats, events, replies) goes through the one shared connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import nats.errors
from nats.aio.msg import Msg

from souq.bus import subjects
from souq.bus.nats import NatsTransport
from souq.bus.transport import Handler
from souq.protocol.verbs import CLAIM, CLAIM_BATCH, DIGEST, GET, LOCATE

__all__ = ["FleetBus", "WorkerPort"]

log = logging.getLogger(__name__)

# Verbs whose answer never waits (no timer, no other message): the bulk of a broker's traffic,
# answered in the subscription's own task rather than one task each. Any other verb (a wait,
# a destroy that waits for its process...) gets a task of its own, so that it holds nothing up.
_PROMPT = frozenset({CLAIM.name, CLAIM_BATCH.name, DIGEST.name, GET.name, LOCATE.name})
FANOUT_SLICE = 64  # a broadcast answered for every worker yields to the loop this often


@dataclass
class _Registration:
    bus: FleetBus
    subject: str
    handler: Handler

    async def unsubscribe(self) -> None:
        self.bus.unregister(self)


@dataclass
class FleetBus:
    transport: NatsTransport
    _verbs: dict[str, Handler] = field(default_factory=dict)  # worker id -> its verb handler
    _fanout: dict[str, list[Handler]] = field(default_factory=dict)  # subject -> handlers
    _subs: dict[str, Any] = field(default_factory=dict)  # subject -> nats subscription
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> None:
        self._subs[subjects.ALL_WORKER_VERBS] = await self.transport.client.subscribe(
            subjects.ALL_WORKER_VERBS, cb=self._on_verb
        )

    def port(self) -> WorkerPort:
        return WorkerPort(self)

    async def register(self, subject: str, handler: Handler) -> _Registration:
        worker_id = _worker_of(subject)
        if worker_id is not None:
            self._verbs[worker_id] = handler
        else:
            self._fanout.setdefault(subject, []).append(handler)
            if subject not in self._subs:
                self._subs[subject] = await self.transport.client.subscribe(
                    subject, cb=self._on_fanout
                )
        return _Registration(self, subject, handler)

    def unregister(self, reg: _Registration) -> None:
        worker_id = _worker_of(reg.subject)
        if worker_id is not None:
            if self._verbs.get(worker_id) is reg.handler:
                del self._verbs[worker_id]
            return
        handlers = self._fanout.get(reg.subject, [])
        with contextlib.suppress(ValueError):
            handlers.remove(reg.handler)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_verb(self, msg: Msg) -> None:
        if not self.transport.accepts(msg):
            return
        _, _, worker_id, verb = msg.subject.split(".", 3)
        handler = self._verbs.get(worker_id)
        if handler is None:  # not one of ours (a real agent, or a worker that left)
            return
        if verb in _PROMPT:
            await self._answer([handler], msg)  # answered before the next message is read
        else:
            self._spawn(self._answer([handler], msg))

    async def _on_fanout(self, msg: Msg) -> None:
        if not self.transport.accepts(msg):
            return
        handlers = list(self._fanout.get(msg.subject, ()))
        if handlers:
            self._spawn(self._answer(handlers, msg))

    async def _answer(self, handlers: Sequence[Handler], msg: Msg) -> None:
        data = bytes(msg.data)
        for n, handler in enumerate(handlers, 1):
            if n % FANOUT_SLICE == 0:
                await asyncio.sleep(0)  # let the replies so far go out, and other work run
            try:
                reply = await handler(msg.subject, data)
            except Exception:
                log.exception("a hollow worker failed to handle %s", msg.subject)
                continue
            if reply is not None and msg.reply:
                try:
                    await self.transport.client.publish(msg.reply, reply)
                except nats.errors.Error as exc:
                    log.warning("could not reply on %s: %s", msg.subject, exc)

    async def flush(self) -> None:
        await self.transport.flush()

    async def close(self) -> None:
        for sub in self._subs.values():
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        self._subs.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _worker_of(subject: str) -> str | None:
    """The worker id of ``souq.worker.<id>.*``, else None (a broadcast subject)."""
    parts = subject.split(".")
    if len(parts) == 4 and parts[0] == subjects.PREFIX and parts[1] == "worker" and parts[3] == "*":
        return parts[2]
    return None


class WorkerPort:
    """One hollow worker's view of the fleet's connection: a :class:`Transport`."""

    def __init__(self, bus: FleetBus) -> None:
        self._bus = bus
        self._t = bus.transport
        # An outage: every worker keeps its events, then announces itself again.
        self.on_disconnect = bus.transport.on_disconnect
        self.on_reconnect = bus.transport.on_reconnect

    @property
    def connected(self) -> bool:
        return self._t.connected

    async def publish(self, subject: str, data: bytes) -> None:
        await self._t.publish(subject, data)

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        return await self._t.request(subject, data, timeout)

    async def gather(
        self, subject: str, data: bytes, *, expect: int | None, timeout: float
    ) -> list[bytes]:
        return await self._t.gather(subject, data, expect=expect, timeout=timeout)

    async def gather_from(
        self, subjects: Sequence[str], data: bytes, *, timeout: float
    ) -> list[bytes]:
        return await self._t.gather_from(subjects, data, timeout=timeout)

    async def subscribe(
        self, subject: str, handler: Handler, *, queue: str | None = None
    ) -> _Registration:
        return await self._bus.register(subject, handler)

    async def flush(self) -> None:
        """Nothing: the fleet flushes once, when every worker has subscribed."""

    async def close(self) -> None:
        """Nothing: the fleet owns the connection."""
