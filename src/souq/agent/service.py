"""The agent on the bus: subscriptions in, the verb table (:mod:`souq.agent.verbs`) answering,
the :class:`~souq.agent.publisher.Publisher` telling.

* ``souq.worker.<id>.<verb>``: every verb addressed to this worker (:mod:`souq.protocol.verbs`);
* ``souq.offers.<region>``: the ``offer`` verb, asked of the whole region;
* ``souq.all.list``, ``souq.all.locate`` and ``souq.all.digest``: every worker answers for its
  own machines;
* ``souq.discover``: publish a heartbeat at once.

Every reply is a ``Reply`` envelope: a typed error from the tree crosses the bus intact, and a
verb this agent does not know is answered with ``unknown_verb``.
"""

from __future__ import annotations

import re

from souq.agent.capacity.load import LoadGauge
from souq.agent.machines.commands import Commands
from souq.agent.machines.executor import Executor
from souq.agent.outbox import Outbox
from souq.agent.publisher import Pacer, Publisher
from souq.agent.stats import AgentStats
from souq.agent.verbs import WorkerVerbs
from souq.bus import subjects
from souq.bus.transport import Handler, Subscription, Transport
from souq.clock import Clock
from souq.logs import log_context
from souq.model.worker import Fingerprint
from souq.protocol.verbs import CLAIM, CLAIM_BATCH, DIGEST, LIST, LOCATE, OFFER, VOLUME_LIST

__all__ = ["AgentService"]

_MACHINE_ID = re.compile(rb'"machine_id":\s*"([^"]{1,64})"')  # for log lines (souq.logs)
_NEW_MACHINES = frozenset({CLAIM.name, CLAIM_BATCH.name})
_TO_ALL = (LIST, LOCATE, DIGEST, VOLUME_LIST)  # asked of every worker: souq.all.<verb>


class AgentService:
    def __init__(
        self,
        executor: Executor,
        commands: Commands,
        transport: Transport,
        outbox: Outbox,
        *,
        labels: dict[str, str],
        fingerprint: Fingerprint,
        heartbeat_interval_s: float,
        clock: Clock,
        load: LoadGauge | None = None,
        pacer: Pacer | None = None,
    ) -> None:
        self._transport = transport
        self._outbox = outbox
        self.worker_id = executor.worker_id
        self.region = executor.region
        self.stats = AgentStats(
            capacity=lambda: executor.admission.capacity,
            allocated=lambda: executor.allocated,
            pending_events=lambda: len(outbox),
            connected=lambda: transport.connected,
        )
        self.verbs = WorkerVerbs(
            executor,
            commands,
            labels=labels,
            fingerprint=fingerprint,
            clock=clock,
            stats=self.stats,
            load=load,
        )
        self.publisher = Publisher(
            transport,
            outbox,
            region=self.region,
            worker_id=self.worker_id,
            interval_s=heartbeat_interval_s,
            worker_info=self.verbs.worker_info,
            usage=self.verbs.usage,
            layers=self.verbs.layers,
            stats=self.stats,
            pacer=pacer,
            json_of=executor.store.json_of,
        )
        self.verbs.publisher = self.publisher
        if executor.images is not None:
            executor.images.on_change = self.publisher.announce
        self.dispatcher = self.verbs.dispatcher()
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        t = self._transport
        self._subs = [
            await t.subscribe(subjects.offers(self.region), self._answering(OFFER.name)),
            await t.subscribe(subjects.worker_verbs(self.worker_id), self._on_worker),
            *[
                await t.subscribe(subjects.all_workers(verb.name), self._answering(verb.name))
                for verb in _TO_ALL
            ],
            await t.subscribe(subjects.DISCOVER, self._on_discover),
        ]
        flush = getattr(t, "flush", None)
        if flush is not None:
            await flush()  # subscriptions are live on the server before we announce ourselves
        await self.publisher.start()
        self.verbs.quotes.start()
        await self.publisher.heartbeat()

    async def stop_listening(self) -> None:
        """Take no more requests (at shutdown, before machines are stopped)."""
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs = []
        self.publisher.unhook()

    async def aclose(self) -> None:
        await self.stop_listening()
        self.verbs.quotes.close()
        await self.publisher.aclose()

    async def _on_worker(self, subject: str, data: bytes) -> bytes:
        verb = subjects.verb_of(subject)
        # A claim names no machine yet (and is the largest message: not worth a search).
        found = None if verb in _NEW_MACHINES else _MACHINE_ID.search(data)
        machine_id = found.group(1).decode() if found else None
        with log_context(worker_id=self.worker_id, machine_id=machine_id):
            return await self.dispatcher.answer(verb, data)

    def _answering(self, verb: str) -> Handler:
        """The handler of a subject whose every request is ``verb``."""

        async def answer(subject: str, data: bytes) -> bytes:
            return await self.dispatcher.answer(verb, data)

        return answer

    async def _on_discover(self, subject: str, data: bytes) -> None:
        await self.publisher.heartbeat()
