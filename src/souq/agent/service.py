"""The agent on the bus: exactly the subjects and messages of docs/architecture.md.

* ``souq.offers.<region>``: answer an :class:`Offer` (eligible, or why not).
* ``souq.worker.<id>.<verb>``: ``claim``, ``get``, ``start``, ``stop``, ``restart``, ``signal``,
  ``destroy``, ``wait``, ``logs``, ``events``, ``ops`` (the op log); ``hold``, ``quote``,
  ``release`` (quotes);
  ``cordon`` (cordon or uncordon the worker); ``drain`` (cordon it and stop its machines).
* ``souq.all.list``, ``souq.all.locate`` and ``souq.all.digest``: every worker answers for its
  own machines (``digest``: a hash of them, for the cluster view's anti-entropy; ``list`` and
  ``digest`` are worker verbs too).
* ``souq.discover``: publish a heartbeat at once.
* Publishes a :class:`Heartbeat` on ``souq.hb.<region>.<id>`` every interval (and at start and on
  reconnect) and a :class:`MachineEventMessage` on ``souq.evt.<region>.<id>`` for every event
  (the events ready at once go in one message: a JSON array of them).

NATS outages: machines go on (their supervision is local). Events wait in the :class:`Outbox`
until the connection is back, then go out in order; heartbeats are not sent meanwhile. On
reconnect the agent announces itself at once with ``reconnects`` one higher, which makes every
broker re-list its machines (what a lost connection may have swallowed comes back that way).

Every reply is a ``Reply`` envelope: a typed error from the tree crosses the bus intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from pydantic import BaseModel

from souq.agent.artifacts import ArtifactCache
from souq.agent.batch import claim_batch
from souq.agent.commands import Commands
from souq.agent.executor import Executor
from souq.agent.load import LoadGauge
from souq.agent.outbox import Outbox
from souq.agent.quotes import Quotes
from souq.agent.stats import AgentStats
from souq.bus import subjects
from souq.bus.codec import decode, encode, encode_many, error_reply, ok_reply
from souq.bus.transport import Subscription, Transport
from souq.clock import Clock, iso_from_ms
from souq.errors import ClaimRefused, NotFound, SouqError, Unavailable
from souq.logs import log_context
from souq.model.batch import BatchClaimRequest
from souq.model.machine import MachineState
from souq.model.protocol import (
    ClaimRequest,
    CordonCommand,
    DestroyCommand,
    DrainCommand,
    EventsCommand,
    HoldRequest,
    ListCommand,
    LocateCommand,
    LocateReply,
    LogsCommand,
    MachineEventMessage,
    MachineRef,
    Offer,
    OfferRequest,
    QuoteRef,
    SignalCommand,
    StopCommand,
    WaitCommand,
    WorkerDigest,
)
from souq.model.resources import Resources
from souq.model.worker import Fingerprint, Heartbeat, WorkerInfo, WorkerState
from souq.placement.stages import shortfall
from souq.view.digest import machines_digest

__all__ = ["AgentService"]

log = logging.getLogger(__name__)
# Machine events wait this long after the reply that made them (they also gather: a burst of
# changes goes out in fewer messages). Long enough for the broker to read the reply first.
EVENTS_LINGER_S = 0.002

Verb = Callable[[bytes], Awaitable[BaseModel | list[Any]]]
_MACHINE_ID = re.compile(rb'"machine_id":\s*"([^"]{1,64})"')  # for log lines (souq.logs)


MESSAGE_BYTES = 256 * 1024  # events per message: up to this size (NATS allows 1 MiB)


def _event_messages(batch: list[MachineEventMessage]) -> Iterator[tuple[int, bytes]]:
    """``batch`` as messages of consecutive events: ``(how many, payload)``, each payload one
    event or a JSON array of several (:func:`souq.bus.codec.encode_many`)."""
    group: list[bytes] = []
    size = 0
    for msg in batch:
        data = encode(msg)
        if group and size + len(data) > MESSAGE_BYTES:
            yield len(group), group[0] if len(group) == 1 else encode_many(group)
            group, size = [], 0
        group.append(data)
        size += len(data) + 1
    if group:
        yield len(group), group[0] if len(group) == 1 else encode_many(group)


class AgentService:
    def __init__(
        self,
        executor: Executor,
        commands: Commands,
        transport: Transport,
        outbox: Outbox,
        *,
        capacity: Resources,
        labels: dict[str, str],
        fingerprint: Fingerprint,
        heartbeat_interval_s: float,
        clock: Clock,
    ) -> None:
        self._ex = executor
        self._cmd = commands
        self._transport = transport
        self._outbox = outbox
        self.worker_id = executor.worker_id
        self.region = executor.region
        self.capacity = capacity
        self.labels = dict(labels)
        self.fingerprint = fingerprint
        self._interval = heartbeat_interval_s
        self._clock = clock
        self._seq = 0
        self.reconnects = 0  # times the bus came back (sent in heartbeats)
        self.stats = AgentStats(
            capacity=lambda: self.capacity,
            allocated=lambda: self._ex.allocated,
            pending_events=lambda: len(self._outbox),
            connected=lambda: self._transport.connected,
        )
        self._bus_up = asyncio.Event()
        self._subs: list[Subscription] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._hooks: list[tuple[list[Callable[[], Any]], Callable[[], Any]]] = []
        self._verbs: dict[str, Verb] = {
            "offer": self._offer,  # a sampled request for offers (see souq.broker.sampling)
            "claim_batch": self._claim_batch,  # several machines in one claim (souq.agent.batch)
            "claim": self._claim,
            "get": self._get,
            "start": self._start,
            "stop": self._stop,
            "restart": self._restart,
            "signal": self._signal,
            "destroy": self._destroy,
            "wait": self._wait,
            "logs": self._logs,
            "events": self._events,
            "ops": self._ops,
            "hold": self._hold,
            "quote": self._quote,
            "release": self._release,
            "cordon": self._cordon,
            "drain": self._drain,
            "list": self._list,  # one worker's machines (the cluster view's anti-entropy)
            "digest": self._digest,
        }
        self.cordoned = executor.store.meta("cordoned") == "1"
        self.draining = executor.store.meta("draining") == "1"
        self.quotes = Quotes(executor.store, clock, self.worker_id, on_change=self._announce)
        self._announcing: asyncio.Task[None] | None = None
        self._load = LoadGauge(clock)
        self._artifacts = ArtifactCache()

    # -- life ----------------------------------------------------------------------------------

    async def start(self) -> None:
        t = self._transport
        self._subs = [
            await t.subscribe(subjects.offers(self.region), self._on_offer),
            await t.subscribe(subjects.worker_verbs(self.worker_id), self._on_worker),
            await t.subscribe(subjects.all_workers("list"), self._on_list),
            await t.subscribe(subjects.all_workers("locate"), self._on_locate),
            await t.subscribe(subjects.all_workers("digest"), self._on_digest),
            await t.subscribe(subjects.DISCOVER, self._on_discover),
        ]
        for name, hook in (("on_disconnect", self._bus_lost), ("on_reconnect", self._bus_back)):
            hooks = getattr(t, name, None)
            if isinstance(hooks, list):  # NATS: keep events during an outage, then announce
                hooks.append(hook)
                self._hooks.append((hooks, hook))
        if t.connected:
            self._bus_up.set()
        flush = getattr(t, "flush", None)
        if flush is not None:
            await flush()  # subscriptions are live on the server before we announce ourselves
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._publish_events(), name="souq-agent-events"),
            loop.create_task(self._heartbeats(), name="souq-agent-heartbeat"),
        ]
        self.quotes.start()
        await self.heartbeat()

    async def stop_listening(self) -> None:
        """Take no more requests (at shutdown, before machines are stopped)."""
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs = []
        for hooks, hook in self._hooks:
            with contextlib.suppress(ValueError):
                hooks.remove(hook)
        self._hooks = []

    async def aclose(self) -> None:
        await self.stop_listening()
        self.quotes.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._transport.connected:
            await self._send_events()  # events of the shutdown itself
        if self._outbox:
            log.warning(
                "%d machine events not published (the bus is down); the next agent's "
                "announcement makes the brokers re-list this worker",
                len(self._outbox),
            )

    # -- heartbeats and events -----------------------------------------------------------------

    def worker_info(self) -> WorkerInfo:
        return WorkerInfo(
            id=self.worker_id,
            region=self.region,
            state=self._state(),
            capacity=self.capacity,
            allocated=self._ex.allocated.plus(self.quotes.held()),
            labels=self.labels,
            fingerprint=self.fingerprint,
            machines=self._ex.machine_count(),
            last_seen=self._clock.now_ms(),
        )

    def _state(self) -> WorkerState:
        if self.draining and self._cmd.running():
            return WorkerState.DRAINING
        return WorkerState.CORDONED if self.cordoned else WorkerState.UP

    async def heartbeat(self) -> None:
        if not self._transport.connected:
            return  # a stale heartbeat buffered through an outage would tell nothing true
        self._seq += 1
        beat = Heartbeat(
            worker=self.worker_info(),
            seq=self._seq,
            interval_s=self._interval,
            reconnects=self.reconnects,
        )
        try:
            await self._transport.publish(
                subjects.heartbeat(self.region, self.worker_id), encode(beat)
            )
        except Unavailable as exc:
            log.debug("heartbeat not sent: %s", exc)
        else:
            self.stats.last_heartbeat = time.time()

    def _announce(self) -> None:
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
            self.worker_id,
            len(self._outbox),
        )
        await self.heartbeat()

    async def _publish_events(self) -> None:
        while True:
            await self._outbox.wait()
            await self._bus_up.wait()
            # The reply to the claim or command that made these events goes out first, and the
            # events a moment later (EVENTS_LINGER_S): sent at once, they reach the broker
            # with the reply, and it applies them to its view before it reads the reply.
            await asyncio.sleep(EVENTS_LINGER_S)
            await self._send_events()

    async def _send_events(self) -> None:
        """Send what the outbox holds, in order, several events to a message (a claim makes
        three at once; a batch claim hundreds); put back what the bus did not take."""
        batch = self._outbox.take()
        subject = subjects.events(self.region, self.worker_id)
        at = 0
        for size, payload in _event_messages(batch):
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

    # -- requests ------------------------------------------------------------------------------

    async def _answer(self, verb: Verb, data: bytes) -> bytes:
        try:
            return ok_reply(await verb(data))
        except SouqError as exc:
            return error_reply(exc)
        except Exception as exc:
            log.exception("the agent failed to answer a request")
            return error_reply(SouqError(f"worker {self.worker_id} failed: {exc!r}"))

    async def _on_worker(self, subject: str, data: bytes) -> bytes:
        name = subjects.verb_of(subject)
        verb = self._verbs.get(name)
        if verb is None:
            return error_reply(NotFound(f"worker {self.worker_id} has no verb {name!r}"))
        found = _MACHINE_ID.search(data)
        machine_id = found.group(1).decode() if found else None
        with log_context(worker_id=self.worker_id, machine_id=machine_id):
            return await self._answer(verb, data)

    async def _on_offer(self, subject: str, data: bytes) -> bytes:
        return await self._answer(self._offer, data)

    async def _on_list(self, subject: str, data: bytes) -> bytes:
        return await self._answer(self._list, data)

    async def _on_locate(self, subject: str, data: bytes) -> bytes:
        return await self._answer(self._locate, data)

    async def _on_digest(self, subject: str, data: bytes) -> bytes:
        return await self._answer(self._digest, data)

    async def _on_discover(self, subject: str, data: bytes) -> None:
        await self.heartbeat()

    def offer(self, req: OfferRequest) -> Offer:
        info = self.worker_info()
        existing = self._ex.machine_for_request(req.request_id)
        if existing is not None:
            return Offer(worker=info, eligible=True, existing_machine_id=existing)
        if self.cordoned:
            return Offer(
                worker=info,
                eligible=False,
                reason="cordoned",
                detail=f"worker {self.worker_id} is cordoned: it takes no new machines",
            )
        # What placement scores beyond capacity: the host's measured load (cached, refreshed
        # at most every 0.5 s), the artifact cache, and the app's machines already here.
        load = self._load.read()
        artifacts = self._artifacts.artifacts(self._ex.records_made, self._ex.rows)
        mine = self._ex.machine_count(req.app)
        short = shortfall(req.resources, info.capacity, info.allocated)
        if short is not None:
            return Offer(
                worker=info,
                eligible=False,
                reason=short.reason,
                detail=short.detail,
                load=load,
                artifacts=artifacts,
                app_machines=mine,
            )
        return Offer(worker=info, eligible=True, load=load, artifacts=artifacts, app_machines=mine)

    async def _offer(self, data: bytes) -> Offer:
        self.stats.offers += 1
        return self.offer(decode(data, OfferRequest))

    async def _list(self, data: bytes) -> list[Any]:
        cmd = decode(data, ListCommand)
        return self._ex.list_machines(cmd.app, include_destroyed=cmd.include_destroyed)

    async def _digest(self, data: bytes) -> WorkerDigest:
        rows = [r for r in self._ex.rows() if r.state is not MachineState.DESTROYED]
        return WorkerDigest(
            worker_id=self.worker_id,
            machines=len(rows),
            digest=machines_digest((r.id, r.state.value, iso_from_ms(r.updated_at)) for r in rows),
        )

    async def _locate(self, data: bytes) -> LocateReply:
        cmd = decode(data, LocateCommand)
        return LocateReply(worker_id=self.worker_id, found=self._ex.has(cmd.machine_id))

    def _refuse_if_cordoned(self) -> None:
        if self.cordoned:
            raise ClaimRefused(
                f"worker {self.worker_id} is cordoned",
                hint="it takes no new machines; try another worker",
                details={"reason": "cordoned"},
            )

    async def _claim(self, data: bytes) -> BaseModel:
        req = decode(data, ClaimRequest)
        try:
            if req.quote_id is None:  # a quote's hold was made before any cordon
                self._refuse_if_cordoned()
            if req.quote_id is not None and req.placement is None:
                # The machine keeps the explanation of the placement its quote made.
                req = req.model_copy(update={"placement": self.quotes.placement(req.quote_id)})
            machine = self._cmd.claim(req, self.capacity)
        except ClaimRefused as exc:
            self.stats.claimed(str(exc.details.get("reason", exc.status)))
            raise
        self.stats.claimed("accepted")
        if req.quote_id is not None:
            self.quotes.used(req.quote_id)
        return machine

    async def _claim_batch(self, data: bytes) -> BaseModel:
        req = decode(data, BatchClaimRequest)
        self._refuse_if_cordoned()
        return claim_batch(
            self._ex,
            self._cmd,
            req,
            capacity=self.capacity,
            in_use=self.worker_info().allocated,
        )

    async def _hold(self, data: bytes) -> BaseModel:
        req = decode(data, HoldRequest)
        self._refuse_if_cordoned()
        return self.quotes.hold(req, self.capacity)

    async def _quote(self, data: bytes) -> BaseModel:
        ref = decode(data, QuoteRef)
        return self.quotes.get(ref.app, ref.quote_id)

    async def _release(self, data: bytes) -> BaseModel:
        ref = decode(data, QuoteRef)
        return self.quotes.release(ref.app, ref.quote_id)

    async def _cordon(self, data: bytes) -> BaseModel:
        """Cordon or uncordon: a cordoned worker makes no offers and refuses new claims; its
        machines keep running. Kept across agent restarts."""
        cmd = decode(data, CordonCommand)
        if cmd.cordoned != self.cordoned or (self.draining and not cmd.cordoned):
            self._ex.store.set_meta("cordoned", "1" if cmd.cordoned else "0")
            if not cmd.cordoned:
                self._ex.store.set_meta("draining", "0")
                self.draining = False
            self.cordoned = cmd.cordoned
            await self.heartbeat()
        return self.worker_info()

    async def _drain(self, data: bytes) -> BaseModel:
        """Cordon the worker and stop its machines gracefully, each with its own stop config.
        Answers at once; the worker reports ``draining`` until none runs, then ``cordoned``.
        ``uncordon`` ends a drain (stopped machines stay stopped)."""
        decode(data, DrainCommand)
        if not (self.cordoned and self.draining):
            self._ex.store.set_meta("cordoned", "1")
            self._ex.store.set_meta("draining", "1")
            self.cordoned = self.draining = True
        stopped = self._cmd.stop_every()
        log.info("draining worker %s: stopping %d machines", self.worker_id, len(stopped))
        await self.heartbeat()
        return self.worker_info()

    async def _get(self, data: bytes) -> BaseModel:
        ref = decode(data, MachineRef)
        return self._ex.machine(ref.app, ref.machine_id)

    async def _start(self, data: bytes) -> BaseModel:
        ref = decode(data, MachineRef)
        return self._cmd.start(ref.app, ref.machine_id)

    async def _stop(self, data: bytes) -> BaseModel:
        cmd = decode(data, StopCommand)
        return self._cmd.stop(cmd.app, cmd.machine_id, signal=cmd.signal, timeout_s=cmd.timeout_s)

    async def _restart(self, data: bytes) -> BaseModel:
        cmd = decode(data, StopCommand)
        return await self._cmd.restart(
            cmd.app, cmd.machine_id, signal=cmd.signal, timeout_s=cmd.timeout_s
        )

    async def _signal(self, data: bytes) -> BaseModel:
        cmd = decode(data, SignalCommand)
        return self._cmd.signal(cmd.app, cmd.machine_id, cmd.signal)

    async def _destroy(self, data: bytes) -> BaseModel:
        cmd = decode(data, DestroyCommand)
        return await self._cmd.destroy(cmd.app, cmd.machine_id, force=cmd.force)

    async def _wait(self, data: bytes) -> BaseModel:
        cmd = decode(data, WaitCommand)
        return await self._cmd.wait(cmd.app, cmd.machine_id, cmd.state, cmd.timeout_s)

    async def _logs(self, data: bytes) -> BaseModel:
        cmd = decode(data, LogsCommand)
        return await self._cmd.logs(
            cmd.app,
            cmd.machine_id,
            offset=cmd.offset,
            max_bytes=cmd.max_bytes,
            wait_s=cmd.wait_s,
        )

    async def _ops(self, data: bytes) -> list[Any]:
        ref = decode(data, MachineRef)
        return self._cmd.ops(ref.app, ref.machine_id)

    async def _events(self, data: bytes) -> list[Any]:
        cmd = decode(data, EventsCommand)
        return self._cmd.events(cmd.app, cmd.machine_id)
