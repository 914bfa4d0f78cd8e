"""A daemon given several NATS servers (``--nats a,b``) connects to one that answers and, when it
dies, moves to another: real nats-servers on loopback."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from souq.bus.nats import connect, nats_servers
from souq.errors import InvalidInput, Unavailable
from souq.natscluster import NatsCluster
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


def test_a_port_another_program_holds_is_refused_at_once(tmp_path: Path) -> None:
    """Another program listens on the port: the server is not started (it would exit, and that
    program would answer in its place), and the error names the port."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        server = NatsServer(port=port, store_dir=tmp_path / "n")
        with pytest.raises(Unavailable, match=f"cannot listen on 127.0.0.1:{port}"):
            server.start()
        assert server.process is None


def test_a_cluster_whose_node_exits_says_so_without_waiting_out_its_timeout(
    tmp_path: Path,
) -> None:
    """A node of a cluster that exits while the cluster forms (its port taken after the check,
    or its store unreadable) is named with what its log says, long before the timeout."""
    cluster = NatsCluster(tmp_path / "nats", 3)
    cluster.launch()
    try:
        first = cluster.nodes[0]
        assert first.process is not None
        first.process.kill()
        first.process.wait()
        # (Waited out, the error would name the others as not healthy.)
        with pytest.raises(Unavailable, match=f"NATS node {first.url} exited"):
            cluster.wait_healthy(timeout=120)
    finally:
        cluster.stop()
