"""Reading buckets against a real NATS with JetStream when a watch is behind: a bucket's keys
are the stream's own answer, which does not depend on a watch's first message arriving in
time (``kv.keys()`` can answer "no keys" for a full bucket on a busy client), and never a
deleted key; a machine's start waits for the agent's mirror of the secrets to hold the last
change."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from pathlib import Path

import nats
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js.kv import KeyValue

from souq.agent.machines import secrets as agent_secrets
from souq.agent.machines.secrets import AgentSecrets
from souq.auth.files import AuthDir
from souq.bus.jetstream import keys_written, live_keys
from souq.secrets.store import SecretStore, open_bucket, secrets_key


async def _bucket(url: str) -> tuple[Client, KeyValue]:
    nc = await nats.connect(url)
    kv = await nc.jetstream().create_key_value(bucket=f"keys-{secrets.token_hex(4)}", history=1)
    return nc, kv


def test_keys_of_a_bucket_whose_watch_answered_none(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        nc, kv = await _bucket(nats_url)
        try:
            for key in ("app.b", "app.a", "other.x", "gone"):
                await kv.put(key, b"1")
            await kv.delete("gone")
            assert sorted(await live_keys(kv)) == ["app.a", "app.b", "other.x"]

            async def none_seen(*_: object, **__: object) -> list[str]:
                raise nats.js.errors.NoKeysError  # what the watch's race answers

            monkeypatch.setattr(kv, "keys", none_seen)
            assert await live_keys(kv) == ["app.a", "app.b", "other.x"]
            assert await keys_written(kv, "app.*") == ["app.a", "app.b"]
            assert await keys_written(kv) == ["app.a", "app.b", "gone", "other.x"]
            await kv.delete("app.a")
            await kv.delete("app.b")
            await kv.delete("other.x")
            assert await live_keys(kv) == []  # empty for real: markers only
        finally:
            await nc.close()

    asyncio.run(body())


def test_a_claim_waits_for_the_secrets_version_it_names(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's mirror of the secrets lags (here: stopped while a broker sets one); a claim
    naming the version that set made is not answered from the stale mirror, but once the
    mirror has read it, and a version the mirror never reaches is answered False."""
    monkeypatch.setattr(agent_secrets, "_CATCH_UP_S", 120.0)  # the bound is not what is tested

    async def body() -> None:
        auth = AuthDir.create(tmp_path / "auth")
        nc = await nats.connect(nats_url)
        try:
            kv = await open_bucket(nc)  # made, as a broker does
            mirror = AgentSecrets(auth.path)
            mirror.attach(nc)
            assert await mirror.caught_up(0)
            assert mirror._task is not None
            mirror._task.cancel()  # the mirror falls behind
            with contextlib.suppress(asyncio.CancelledError):
                await mirror._task
            written: list[int] = []
            store = SecretStore(kv, secrets_key(auth), on_write=written.append)
            await store.set("web", {"TOKEN": "fresh-value"})
            assert written == [await store.version()]

            waiting = asyncio.ensure_future(mirror.caught_up(written[0]))
            for _ in range(20):  # held while the mirror has not read it ...
                await asyncio.sleep(0)
            assert not waiting.done()
            mirror.attach(nc)  # ... and answered once it has
            assert await asyncio.wait_for(waiting, 30)
            assert mirror.for_machine("m1", "web") == {"TOKEN": "fresh-value"}

            monkeypatch.setattr(agent_secrets, "_CATCH_UP_S", 0.05)
            assert not await mirror.caught_up(written[0] + 1000)
        finally:
            await nc.close()

    asyncio.run(body())
