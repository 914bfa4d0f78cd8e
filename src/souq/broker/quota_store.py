"""The quotas bucket (``souq-quotas``): one JetStream key per scope (``app.<app>``,
``org.<slug>``) holding its limits and ledger (:class:`souq.model.quota.QuotaRecord`), every
change a compare-and-set on the revision it was computed from (docs/quotas.md).

Two things keep a create's cost down without giving up exactness:

* **group commit** — the changes this broker asks of one key while a write of it is under way
  wait, then go in one compare-and-set, each applied to the record as the ones before it left
  it (a change that raises is left out, and its caller gets the error);
* **the last write's revision** — a broker that wrote a key last knows its record and revision
  without reading them: the next change is computed on that and written conditioned on it.
  Another broker having written since, JetStream refuses the write (wrong last sequence) and
  the change is computed again on a fresh read. A refusal (or a change that writes nothing) is
  never answered from the remembered record: it is checked again on a fresh read first.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from souq.bus.jetstream import BucketStore, unavailable
from souq.clock import Clock
from souq.errors import Unavailable
from souq.model.quota import QuotaRecord, Scope, drafted, edited, encoded, sealed

__all__ = ["BUCKET", "Change", "QuotaStore", "key_of"]

BUCKET = "souq-quotas"
WHAT = "the quota store"
_ATTEMPTS = 200  # compare-and-set rounds before a change gives up (503): contention, not a loop

Change = Callable[[QuotaRecord | None], Awaitable[QuotaRecord | None]]
_Waiting = list[tuple[Change, "asyncio.Future[QuotaRecord | None]"]]


def key_of(scope: Scope, name: str) -> str:
    return f"{scope}.{name}"


class QuotaStore(BucketStore):
    BUCKET = BUCKET
    DESCRIPTION = "souq quotas: each scope's limits and ledger"
    WHAT = WHAT

    def __init__(self, kv: KeyValue, clock: Clock | None = None) -> None:
        super().__init__(kv, clock)
        self._queues: dict[str, _Waiting] = {}
        self._draining: set[str] = set()
        self._drains: set[asyncio.Task[None]] = set()  # (held: a task nobody holds may vanish)
        self._parsed: dict[str, tuple[int, QuotaRecord]] = {}  # the last read or write
        self.reads = 0  # JetStream reads of a key (the benchmark reports them)
        self.writes = 0

    async def read(self, key: str) -> tuple[QuotaRecord | None, int]:
        """The record of ``key`` and its revision (0: none)."""
        self.reads += 1
        try:
            entry = await self._kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            self._parsed.pop(key, None)
            return None, 0
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(WHAT, exc) from exc
        revision = entry.revision or 0
        if not entry.value:
            self._parsed.pop(key, None)
            return None, revision
        seen = self._parsed.get(key)
        if seen is not None and seen[0] == revision:
            return seen[1], revision  # unchanged since: not parsed again
        record = QuotaRecord.model_validate_json(entry.value)
        self._parsed[key] = (revision, record)
        return record, revision

    async def change(self, key: str, change: Change) -> QuotaRecord | None:
        """Apply ``change`` to the record of ``key`` by compare-and-set; ``change`` returning
        the record it was given (or None for none) writes nothing. Exact: another broker
        having written first, the batch is computed again on what it wrote."""
        return await self.submit(key, change)

    def submit(self, key: str, change: Change) -> asyncio.Future[QuotaRecord | None]:
        """:meth:`change`, under way once this returns: the future of its outcome (changes of
        several keys awaited together without a task each)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[QuotaRecord | None] = loop.create_future()
        self._queues.setdefault(key, []).append((change, future))
        if key not in self._draining:
            self._draining.add(key)
            task = loop.create_task(self._drain(key))
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)
        return future

    async def _drain(self, key: str) -> None:
        try:
            while self._queues.get(key):
                batch = self._queues.pop(key)
                try:
                    await self._commit(key, batch)
                except BaseException as exc:  # the store failed: every change of the batch
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
        finally:
            self._draining.discard(key)

    async def _commit(self, key: str, batch: _Waiting) -> None:
        remembered = self._parsed.get(key)
        for attempt in range(_ATTEMPTS):
            if attempt == 0 and remembered is not None:
                revision, base = remembered
                record: QuotaRecord | None = base
            else:
                record, revision = await self.read(key)
            trusted = attempt > 0 or remembered is None  # read just now
            current, outcomes = await _applied(record, batch)
            writing = current is not record and current is not None
            if not trusted and (not writing or any(isinstance(o, Exception) for _, o in outcomes)):
                continue  # a refusal or a no-op: checked on a fresh read first
            if writing:
                assert current is not None
                if not await self._write(key, current, revision):
                    if attempt > 0:  # another broker wrote first: back off a little, at random
                        await asyncio.sleep(random.uniform(0, 0.002 * min(attempt, 10)))
                    continue
            for future, outcome in outcomes:
                if future.done():
                    continue
                if isinstance(outcome, Exception):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
            return
        raise Unavailable(
            f"{WHAT}: key {key} changed under every one of {_ATTEMPTS} tries",
            hint="too many changes race on one quota; try again",
        )

    async def _write(self, key: str, record: QuotaRecord, revision: int) -> bool:
        """Write ``record`` if ``key`` is still at ``revision``; False: it is not."""
        body = encoded(record)
        self.writes += 1
        try:
            if revision == 0:
                written = await self._kv.create(key, body)
            else:
                written = await self._kv.update(key, body, last=revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyDeletedError):
            self._parsed.pop(key, None)
            return False
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(WHAT, exc) from exc
        self._parsed[key] = (written, record)
        return True

    async def remove(self, key: str) -> None:
        try:
            await self._kv.delete(key)
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(WHAT, exc) from exc
        self._parsed.pop(key, None)


async def _applied(
    record: QuotaRecord | None, batch: _Waiting
) -> tuple[QuotaRecord | None, list[tuple[asyncio.Future[QuotaRecord | None], Any]]]:
    """The batch's changes applied in turn to ``record``: the record they leave, and each
    change's outcome (the record after it, or its own error: the others go on). A batch of
    more than one works on a draft of ``record`` (:func:`souq.model.quota.drafted`: its
    ledger copied once, not at each change); ``record`` itself is never changed, and a batch
    that changed nothing leaves it as it is."""
    draft = drafted(record) if record is not None and len(batch) > 1 else None
    current = record if draft is None else draft
    outcomes: list[tuple[asyncio.Future[QuotaRecord | None], Any]] = []
    for change, future in batch:
        try:
            new = await change(current)
        except Exception as exc:
            outcomes.append((future, exc))
            continue
        current = current if new is None else new
        outcomes.append((future, current))
    if draft is None:
        return current, outcomes
    for _, outcome in outcomes:
        if isinstance(outcome, QuotaRecord):
            sealed(outcome)  # whoever holds it: changed in place no more
    if current is not None:
        sealed(current)
    if current is draft and not edited(draft):
        return record, [(f, record if o is draft else o) for f, o in outcomes]
    return current, outcomes
