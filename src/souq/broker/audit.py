"""The audit log: every mutating API call, with the token that made it, kept in JetStream.

Each broker publishes an :class:`~souq.auth.access.AuditRecord` per mutating call (refused ones
too) to ``souq.audit.<app>`` (``souq.audit._cluster`` for the cluster's own routes); the stream
``souq-audit`` keeps them (90 days, at most a million entries, file storage), so the log does not
depend on which broker took a call nor on any broker staying up. ``GET /v1/audit`` (admin) reads
the newest entries, optionally of one app. A broker that cannot reach JetStream still writes each
entry to its own log (``souq.audit`` logger), tries again for two minutes, and then says that it
could not store it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from asyncio import Future
from collections.abc import Callable

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck, StorageType, StreamConfig

from souq.bus import subjects
from souq.bus.jetstream import OnFirstUse, stream, unavailable
from souq.model.tokens import AuditRecord

__all__ = ["STREAM", "AuditLog"]

log = logging.getLogger(__name__)

STREAM = "souq-audit"
SUBJECT = subjects.AUDIT
_MAX_AGE_S = 90 * 24 * 3600
_MAX_MSGS = 1_000_000
_PENDING = 10_000  # entries waiting to be stored, at most (then the oldest are only logged)
_CLUSTER = "_cluster"
RETRY_FOR_S = 120.0  # an entry JetStream cannot take is tried again this long (JetStream's
RETRY_FIRST_S = 0.5  # window for duplicate message ids is two minutes by default)
RETRY_MAX_S = 5.0
_BATCH = 256  # entries published before their acknowledgements are awaited, at most
ACK_TIMEOUT_S = 5.0  # how long JetStream has to acknowledge a batch


class AuditLog:
    def __init__(self, client: Callable[[], Client]) -> None:
        self._client = client
        self._stream = OnFirstUse(self._open)
        self._queue: asyncio.Queue[AuditRecord] = asyncio.Queue(_PENDING)
        self._task: asyncio.Task[None] | None = None
        self._js: tuple[Client, JetStreamContext] | None = None

    def record(self, entry: AuditRecord) -> None:
        """Queue ``entry`` to be stored (never blocks the request that made it)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._store(), name="souq-audit")
        try:
            self._queue.put_nowait(entry)
        except asyncio.QueueFull:
            log.warning("audit: %d entries wait to be stored; this one is only logged", _PENDING)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def entries(self, *, app: str | None = None, limit: int = 100) -> list[AuditRecord]:
        """The newest ``limit`` entries (of ``app``), oldest first."""
        js = (await self._stream.get()).jetstream()
        subject = f"{SUBJECT}.{app}" if app else None
        try:
            info = await js.stream_info(STREAM)
            last, first = info.state.last_seq, info.state.first_seq
            found: list[AuditRecord] = []
            seq = last
            # Walk back from the newest: one message at a time (a direct read), up to a bound.
            scanned = 0
            while seq >= first and len(found) < limit and scanned < limit * 50:
                scanned += 1
                try:
                    msg = await js.get_msg(STREAM, seq)
                except nats.js.errors.NotFoundError:
                    seq -= 1
                    continue
                if subject is None or msg.subject == subject:
                    found.append(AuditRecord.model_validate_json(msg.data or b"{}"))
                seq -= 1
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable("the audit log", exc) from exc
        return found[::-1]

    async def _open(self) -> Client:
        nc = self._client()
        try:
            await stream(
                nc.jetstream(),
                StreamConfig(
                    name=STREAM,
                    description="souq audit log: every mutating API call and who made it",
                    subjects=[f"{SUBJECT}.>"],
                    storage=StorageType.FILE,
                    max_age=_MAX_AGE_S,
                    max_msgs=_MAX_MSGS,
                ),
            )
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable("the audit log", exc) from exc
        return nc

    async def _store(self) -> None:
        while True:
            entries = [await self._queue.get()]
            while len(entries) < _BATCH and not self._queue.empty():
                entries.append(self._queue.get_nowait())
            await self._store_batch(entries)

    async def _store_batch(self, entries: list[AuditRecord]) -> None:
        """Store ``entries`` (those that waited together), each published without waiting for
        the one before it to be acknowledged (one JetStream round trip for them all, about a
        fifth of the CPU of storing them one by one); those JetStream did not take are tried
        again for up to ``RETRY_FOR_S``, the entries behind them waiting. Each try carries the
        same message id, so one that landed unanswered is kept once."""
        pending = [(entry, entry.model_dump_json().encode()) for entry in entries]
        loop = asyncio.get_running_loop()
        give_up = loop.time() + RETRY_FOR_S
        pause = RETRY_FIRST_S
        while True:
            failed: list[tuple[AuditRecord, bytes]] = []
            why: BaseException | None = None
            try:
                js = await self._jetstream()
                acks = [await _publish(js, entry, data) for entry, data in pending]
                async with asyncio.timeout(ACK_TIMEOUT_S):
                    answers = await asyncio.gather(*acks, return_exceptions=True)
                for item, answer in zip(pending, answers, strict=True):
                    if isinstance(answer, BaseException):
                        failed.append(item)
                        why = answer
            except Exception as exc:  # every entry is in this broker's log already
                failed, why = pending, exc
            if not failed:
                return
            if loop.time() + pause > give_up:
                log.warning(
                    "audit: an entry could not be stored (%d of them): %s", len(failed), why
                )
                return
            log.info(
                "audit: storing an entry failed (%d of them: %s); trying again", len(failed), why
            )
            pending = failed
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_MAX_S)

    async def _jetstream(self) -> JetStreamContext:
        """One JetStream context per connection: its replies to unacknowledged publishes come
        to one subscription, made on its first publish."""
        nc = await self._stream.get()
        if self._js is None or self._js[0] is not nc:
            self._js = (nc, nc.jetstream())
        return self._js[1]


async def _publish(js: JetStreamContext, entry: AuditRecord, data: bytes) -> Future[PubAck]:
    headers = {"Nats-Msg-Id": hashlib.sha256(data).hexdigest()}
    subject = f"{SUBJECT}.{entry.app or _CLUSTER}"
    return await js.publish_async(subject, data, headers=headers, wait_stall=ACK_TIMEOUT_S)
