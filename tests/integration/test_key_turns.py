"""Turns per Idempotency-Key across brokers, against a real NATS with JetStream: one holder at
a time however many brokers ask at once, another body refused while a key is held, the entry
gone once the turn ends, and a holder that went silent (a crashed broker) taken over."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client

from souq.broker.key_turns import KeyStore, KeyTurns
from souq.errors import IdempotencyConflict


def _against_nats(url: str, body: Callable[[Client, KeyStore], Awaitable[None]]) -> None:
    async def run() -> None:
        nc = await nats.connect(url)
        try:
            await body(nc, await KeyStore.open(nc))
        finally:
            await nc.close()

    asyncio.run(run())


def _turns(store: KeyStore, n: int, lease_s: float = 30.0) -> list[KeyTurns]:
    async def bucket() -> KeyStore:
        return store

    return [KeyTurns(bucket, f"broker-{i}", lease_s=lease_s) for i in range(n)]


def test_one_broker_at_a_time_holds_a_key(nats_url: str) -> None:
    async def body(nc: Client, store: KeyStore) -> None:
        key = "k" + secrets.token_hex(7)
        inside, most, entered = 0, 0, []

        async def place(turns: KeyTurns, i: int) -> None:
            nonlocal inside, most
            async with turns.turn(key, "same body"):
                inside += 1
                most = max(most, inside)
                entered.append(i)
                for _ in range(3):  # real round trips while it holds the turn
                    await nc.flush()
                inside -= 1

        await asyncio.gather(*(place(t, i) for i, t in enumerate(_turns(store, 6))))
        assert sorted(entered) == list(range(6))
        assert most == 1
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await store.bucket.get(key)  # each turn ended: nothing left behind

    _against_nats(nats_url, body)


def test_another_body_with_a_held_key_is_a_conflict(nats_url: str) -> None:
    async def body(nc: Client, store: KeyStore) -> None:
        first, second = _turns(store, 2)
        key = "k" + secrets.token_hex(7)
        async with first.turn(key, "body a"):
            with pytest.raises(IdempotencyConflict, match="different body"):
                async with second.turn(key, "body b", "my-key"):
                    pass
        async with second.turn(key, "body b"):  # free again: any body may take it
            pass

    _against_nats(nats_url, body)


def test_a_holder_gone_silent_is_taken_over(nats_url: str) -> None:
    async def body(nc: Client, store: KeyStore) -> None:
        key = "k" + secrets.token_hex(7)
        # What a broker killed while placing leaves: an entry nobody writes again.
        dead = json.dumps({"digest": "same", "holder": "broker-dead"}).encode()
        await store.bucket.create(key, dead)
        (turns,) = _turns(store, 1, lease_s=0.3)
        async with turns.turn(key, "same"):
            held = json.loads((await store.bucket.get(key)).value or b"")
            assert held["holder"] == "broker-0"

    _against_nats(nats_url, body)


def test_a_holder_keeps_its_turn_past_the_lease(nats_url: str) -> None:
    """A placement longer than the lease (an image pull) keeps its turn: it writes its entry
    again, and a waiter sees it alive and waits."""

    async def body(nc: Client, store: KeyStore) -> None:
        key = "k" + secrets.token_hex(7)
        holder, waiter = _turns(store, 2, lease_s=0.3)
        order: list[str] = []
        revisions: list[int] = []

        async def wait_for_it() -> None:
            async with waiter.turn(key, "same"):
                order.append("waiter")

        async with holder.turn(key, "same"):
            task = asyncio.create_task(wait_for_it())
            first = (await store.bucket.get(key)).revision or 0
            while len(revisions) < 3:  # three renewals seen: well past one lease
                revision = (await store.bucket.get(key)).revision or 0
                if revision > max(revisions, default=first):
                    revisions.append(revision)
                await nc.flush()
            order.append("holder")
        await task
        assert order == ["holder", "waiter"]

    _against_nats(nats_url, body)


def test_a_turn_that_made_the_machine_tells_the_next_where(nats_url: str) -> None:
    async def body(nc: Client, store: KeyStore) -> None:
        first, second = _turns(store, 2)
        key = "k" + secrets.token_hex(7)
        async with first.turn(key, "same") as turn:
            assert turn.made_on is None  # the first: nothing made yet
            turn.made_on = "mad-2"
        async with second.turn(key, "same") as turn:  # a retry, on another broker
            assert turn.made_on == "mad-2"
        with pytest.raises(IdempotencyConflict):  # the key stays this body's
            async with first.turn(key, "another"):
                pass
        assert (await store.bucket.get(key)).value  # kept, for the next retry

    _against_nats(nats_url, body)


def test_a_create_does_not_wait_on_a_store_that_does_not_answer() -> None:
    """JetStream out of reach (a partition, no JetStream): the placement goes on without its
    turn, and the store is left alone a while rather than waited for on every create."""
    asked = 0

    async def unreachable() -> KeyStore:
        nonlocal asked
        asked += 1
        raise nats.errors.TimeoutError

    async def body() -> None:
        turns = KeyTurns(unreachable, "broker-0")
        for _ in range(3):
            async with turns.turn("k" + secrets.token_hex(7), "same") as turn:
                assert turn.made_on is None

    asyncio.run(body())
    assert asked == 1
