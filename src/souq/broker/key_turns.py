"""Turns per ``Idempotency-Key`` across brokers: the JetStream bucket ``souq-idempotency``.

The worker is the judge of a retried create (it knows its machines by request id), but only
once the first attempt's claim has reached it: two brokers placing the same key at the same
moment can each ask for offers before either claim lands, each choose a worker, and make two
machines; and a retry's offers can miss the worker that made the first one if it answers late.
So the placement of a key takes turns, and each turn leaves word of where it made the machine:

* the broker that creates the key's entry (JetStream's create-if-absent) places; another
  broker with the same key waits while the entry names a holder;
* the turn over, the entry names the worker that made the machine (kept ``KEPT_S``); the next
  turn of the key (a retry, a waiter) claims there first, and the worker answers with the
  machine it made. No worker named (the placement failed), the entry is deleted, and the next
  turn places as a first one would (asking offers, ``find_existing``: a machine made by a turn
  cut short is met there);

* **a different body** with a key in use: ``409 idempotency_conflict`` at once;
* **a holder that crashed**: the holder writes its entry again every third of ``lease_s``; a
  waiter that sees the same revision for ``lease_s`` (by its own clock: brokers' clocks need not
  agree) takes the turn over with a compare-and-set on that revision, and its placement finds
  what the crashed one made as any retry would;
* **the store unreachable** (NATS without JetStream, a partition that cut its stream's leader
  off, waited for ``_TIMEOUT_S``): a create never waits on it; it places as it would without
  turns (offers, ``find_existing``), and the brokers skip the store for ``_RETRY_AFTER_S``.
  Then, and only then, a key sent to two brokers at the same moment may make two machines.

Inside one broker, identical requests already share one placement
(:class:`souq.broker.idempotency.Coalescer`): a turn is taken once per broker, not per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from souq.bus.jetstream import BucketStore, unavailable
from souq.clock import Clock, SystemClock
from souq.errors import IdempotencyConflict, Unavailable

__all__ = ["BUCKET", "KeyStore", "KeyTurns", "Turn"]

log = logging.getLogger(__name__)

BUCKET = "souq-idempotency"
WHAT = "the idempotency store"
_FIRST_WAIT_S = 0.01  # a waiter reads the entry again after this, doubling up to _LAST_WAIT_S
_LAST_WAIT_S = 0.25
KEPT_S = 24 * 3600.0  # how long a key's entry says where its machine is (Stripe's 24 h)
_RETRY_AFTER_S = 5.0  # the store did not answer: creates place without turns for this long
_TIMEOUT_S = 1.0  # what a create waits for one answer of the store
_NATS_ERRORS = (nats.errors.Error, nats.js.errors.Error)


@dataclass
class Turn:
    """A turn of one key: ``made_on``, the worker where a turn of it made the machine (an
    earlier one, as its entry says; this one, once the block sets it)."""

    made_on: str | None = None


def _value(digest: str, holder: str | None, made_on: str | None) -> bytes:
    return json.dumps({"digest": digest, "holder": holder, "made_on": made_on}).encode()


class KeyStore(BucketStore):
    BUCKET = BUCKET
    DESCRIPTION = "souq idempotent creates: which broker places each key, where it was made"
    WHAT = WHAT
    TTL_S = KEPT_S
    TIMEOUT_S = _TIMEOUT_S


class KeyTurns:
    """One turn at a time per request id across the brokers sharing ``bucket``."""

    def __init__(
        self,
        bucket: Callable[[], Awaitable[KeyStore]] | None,
        holder: str,
        *,
        clock: Clock | None = None,
        lease_s: float = 30.0,
    ) -> None:
        self._bucket = bucket  # None: a bus without JetStream, a lone broker (no turns to take)
        self._holder = holder  # who holds a turn (the broker), as its entry says
        self._clock = clock or SystemClock()
        self._lease_s = lease_s
        self._unanswered_until = 0.0  # the store did not answer: turns skipped until then

    @contextlib.asynccontextmanager
    async def turn(self, request_id: str, digest: str, key: str = "") -> AsyncIterator[Turn]:
        """Wait for ``request_id``'s turn and hold it for the block (``digest``: the body's
        hash; another body with the same key is an :class:`IdempotencyConflict`). The turn
        says where an earlier one made the key's machine; the block says where it did."""
        if self._bucket is None or self._clock.monotonic() < self._unanswered_until:
            yield Turn()
            return
        try:
            kv = await self._kv()
            turn, revision = await self._take(kv, request_id, digest, key)
        except Unavailable as exc:
            # A create does not wait on JetStream: it places as it would without turns (its
            # offers still meet a machine the key made), and the store is left alone a while.
            self._unanswered_until = self._clock.monotonic() + _RETRY_AFTER_S
            log.warning("request %s placed without its turn: %s", request_id, exc.message)
            yield Turn()
            return
        value = _value(digest, self._holder, turn.made_on)
        done = asyncio.Event()
        renewing = asyncio.get_running_loop().create_task(
            self._renew(kv, request_id, value, revision, done), name=f"turn-{request_id}"
        )
        try:
            yield turn
        finally:
            done.set()  # (not cancelled: a write under way lands, and its revision is known)
            last = await asyncio.shield(renewing)
            with contextlib.suppress(*_NATS_ERRORS):  # not there: a waiter takes it over later
                if turn.made_on is None:
                    await kv.delete(request_id, last=last)
                else:  # what the next turn of this key claims first
                    await kv.update(request_id, _value(digest, None, turn.made_on), last=last)

    async def _kv(self) -> KeyValue:
        assert self._bucket is not None
        try:
            return (await self._bucket()).bucket
        except _NATS_ERRORS as exc:
            raise unavailable(WHAT, exc) from exc

    async def _take(self, kv: KeyValue, request_id: str, digest: str, key: str) -> tuple[Turn, int]:
        """The key's entry made ours (and its revision): created, or written over one that
        says where an earlier turn made the machine, or taken over from a holder gone silent."""
        wait = _FIRST_WAIT_S
        seen: tuple[int, float] | None = None  # (revision, since when by our clock)
        while True:
            try:
                return Turn(), await kv.create(request_id, _value(digest, self._holder, None))
            except nats.js.errors.KeyWrongLastSequenceError:
                pass  # there already: read it
            except _NATS_ERRORS as exc:
                raise unavailable(WHAT, exc) from exc
            try:
                entry = await kv.get(request_id)
            except nats.js.errors.KeyNotFoundError:
                continue  # released meanwhile: create it again
            except _NATS_ERRORS as exc:
                raise unavailable(WHAT, exc) from exc
            held = json.loads(entry.value or b"{}")
            if held.get("digest") != digest:
                raise IdempotencyConflict(
                    f"Idempotency-Key {key!r} is in use by a request with a different body",
                    hint="use a new key for a different request",
                )
            revision, now = entry.revision or 0, self._clock.monotonic()
            if seen is None or seen[0] != revision:
                seen = (revision, now)
            # Nobody holds it (an earlier turn ended), or its holder stopped writing it (gone).
            if held.get("holder") is None or now - seen[1] >= self._lease_s:
                made_on = held.get("made_on")
                try:
                    mine = _value(digest, self._holder, made_on)
                    return Turn(made_on), await kv.update(request_id, mine, last=revision)
                except nats.js.errors.KeyWrongLastSequenceError:
                    seen = None  # another broker took it first
                    continue
                except _NATS_ERRORS as exc:
                    raise unavailable(WHAT, exc) from exc
            await asyncio.sleep(wait)
            wait = min(wait * 2, _LAST_WAIT_S)

    async def _renew(
        self, kv: KeyValue, request_id: str, value: bytes, revision: int, done: asyncio.Event
    ) -> int:
        """Write the entry again every third of the lease until ``done``, so that waiters know
        it is held; the last revision written."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._lease_s / 3):
                    await done.wait()
                return revision
            with contextlib.suppress(*_NATS_ERRORS):  # missed once: the next one may land
                revision = await kv.update(request_id, value, last=revision)
