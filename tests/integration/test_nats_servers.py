"""A daemon given several NATS servers (``--nats a,b``) connects to one that answers and, when it
dies, moves to another: real nats-servers on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from souq.bus.nats import connect, nats_servers
from souq.errors import InvalidInput, Unavailable
from souq.natsserver import NatsServer, free_port
from souq.testing import eventually


def test_a_list_of_servers_is_read_and_an_empty_one_refused() -> None:
    assert nats_servers("nats://a:1, nats://b:2,") == ["nats://a:1", "nats://b:2"]
    with pytest.raises(InvalidInput, match="names no NATS server"):
        nats_servers(" , ")


def test_the_connection_takes_a_live_server_and_moves_when_it_dies(tmp_path: Path) -> None:
    async def scenario() -> None:
        dead = f"nats://127.0.0.1:{free_port()}"
        with NatsServer(store_dir=tmp_path / "a") as a, NatsServer(store_dir=tmp_path / "b") as b:
            transport = await connect(f"{dead},{a.url},{b.url}", name="test", connect_timeout=10)
            try:
                nc = transport.client
                first = str(nc.connected_url.netloc) if nc.connected_url else ""
                assert first in (a.url.removeprefix("nats://"), b.url.removeprefix("nats://"))
                (a if a.url.endswith(first) else b).stop()
                other = b if a.url.endswith(first) else a

                await eventually(
                    lambda: (
                        nc.is_connected
                        and nc.connected_url is not None
                        and other.url.endswith(str(nc.connected_url.netloc))
                    ),
                    timeout=20,
                    message="the client moved to the other server",
                )
                sub = await nc.subscribe("t.ping")
                await nc.publish("t.ping", b"after")
                assert (await sub.next_msg(timeout=5)).data == b"after"
            finally:
                await transport.close()
        with pytest.raises(Unavailable, match="cannot connect to NATS"):
            await connect(dead, name="test", connect_timeout=2)

    asyncio.run(scenario())
