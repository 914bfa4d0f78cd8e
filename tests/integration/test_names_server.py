"""The worker's DNS server on loopback, asked by dnspython as a client: ``.internal`` from the
index, the rest forwarded to a resolver on loopback (the responder of tests/dns_upstream.py),
SERVFAIL when none answers, truncation over UDP and the same answer over TCP."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import AsyncIterator
from typing import Any

import dns.asyncquery
import dns.flags
import dns.message
import dns.rcode
import pytest

from souq.network.dns_server import DnsServer, Forwarder, host_resolvers
from souq.network.names import NameIndex, NameRow, Scope
from tests import dns_upstream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def row(mid: str, app: str = "web", **kw: object) -> NameRow:
    fields: dict[str, object] = {
        "machine_id": mid,
        "app": app,
        "region": "mad",
        "state": "started",
        "healthy": True,
        "private_ip": f"fdaa::{mid}",
        "created_at": mid,
    }
    fields.update(kw)
    return NameRow(**fields)  # type: ignore[arg-type]


def dead_port() -> int:
    """A UDP port on loopback where nothing listens (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def upstream() -> AsyncIterator[int]:
    transport = await dns_upstream.serve_udp()
    try:
        yield int(transport.get_extra_info("sockname")[1])
    finally:
        transport.close()


async def started(index: NameIndex, upstreams: list[tuple[str, int]], **kw: float) -> DnsServer:
    server = DnsServer(
        index, Forwarder(upstreams, timeout_s=kw.get("timeout_s", 2.0)), listen=("127.0.0.1", 0)
    )
    await server.start()
    return server


async def ask(
    server: DnsServer, name: str, rdtype: str = "AAAA", *, tcp: bool = False
) -> dns.message.Message:
    query = dns.message.make_query(name, rdtype)
    host, port = server.address
    if tcp:
        return await dns.asyncquery.tcp(query, host, port=port, timeout=5)
    return await dns.asyncquery.udp(query, host, port=port, timeout=5)


def addresses(response: dns.message.Message) -> list[str]:
    return [rd.to_text() for rrset in response.answer for rd in rrset]


async def test_internal_names_over_udp_and_tcp(upstream: int) -> None:
    index = NameIndex()
    index.put(row("a1"))
    index.put(row("a2", healthy=False, created_at="a0"))
    index.put(row("b1", app="db", state="stopped"))
    server = await started(index, [("127.0.0.1", upstream)])
    try:
        for tcp in (False, True):
            got = await ask(server, "web.internal", tcp=tcp)
            assert got.rcode() == dns.rcode.NOERROR and got.flags & dns.flags.AA
            assert addresses(got) == ["fdaa::a1", "fdaa::a2"]  # healthy first
            assert got.answer[0].ttl == 5
        got = await ask(server, "WEB.Internal.")  # names are case-insensitive
        assert addresses(got) == ["fdaa::a1", "fdaa::a2"]
        assert (await ask(server, "nope.internal")).rcode() == dns.rcode.NXDOMAIN
        empty = await ask(server, "web.internal", "A")  # IPv6 only: the name exists
        assert empty.rcode() == dns.rcode.NOERROR and not empty.answer
        stopped = await ask(server, "db.internal")
        assert stopped.rcode() == dns.rcode.NOERROR and not stopped.answer
        txt = await ask(server, "_apps.internal", "TXT")
        assert [s for rd in txt.answer[0] for s in rd.strings] == [b"db,web"]
        assert server.forwarded == 0
    finally:
        await server.aclose()


async def test_a_large_answer_is_truncated_over_udp_and_whole_over_tcp(upstream: int) -> None:
    index = NameIndex()
    for i in range(60):
        index.put(row(f"m{i:02d}", private_ip=f"fdaa:0:0:1::{i + 1:x}"))
    server = await started(index, [("127.0.0.1", upstream)])
    try:
        query = dns.message.make_query("web.internal", "AAAA")  # no EDNS: 512 bytes
        host, port = server.address
        udp = await dns.asyncquery.udp(query, host, port=port, timeout=5)
        assert udp.flags & dns.flags.TC and not udp.answer
        whole = await ask(server, "web.internal", tcp=True)
        assert len(addresses(whole)) == 60
    finally:
        await server.aclose()


async def test_other_names_go_to_the_upstream(upstream: int) -> None:
    # the first upstream is dead: the second answers within the time left
    server = await started(
        NameIndex(), [("127.0.0.1", dead_port()), ("127.0.0.1", upstream)], timeout_s=1.0
    )
    try:
        got = await ask(server, "example.test", "A")
        assert got.rcode() == dns.rcode.NOERROR
        assert addresses(got) == [dns_upstream.ADDRESS]
        assert server.forwarded == 1
    finally:
        await server.aclose()


async def test_no_upstream_answering_is_servfail_within_the_timeout() -> None:
    server = await started(NameIndex(), [("127.0.0.1", dead_port())], timeout_s=0.3)
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        got = await ask(server, "example.test", "A")
        assert got.rcode() == dns.rcode.SERVFAIL
        assert loop.time() - t0 < 2.0
        assert server.forwarder.failures == 1
        # the server still answers its own names meanwhile
        assert (await ask(server, "nope.internal")).rcode() == dns.rcode.NXDOMAIN
    finally:
        await server.aclose()


async def test_an_asker_known_by_its_address_is_scoped(upstream: int) -> None:
    index = NameIndex()
    index.put(row("a1"))
    index.put(row("me", app="client", private_ip="127.0.0.1"))  # the test asks from here
    index.put(row("x1", app="theirs", scope=Scope("acme")))
    server = await started(index, [("127.0.0.1", upstream)])
    try:
        txt = await ask(server, "_apps.internal", "TXT")
        assert [s for rd in txt.answer[0] for s in rd.strings] == [b"client,web"]
        assert (await ask(server, "theirs.internal")).rcode() == dns.rcode.NXDOMAIN
    finally:
        await server.aclose()


async def test_an_answer_asked_again_is_sent_as_rendered_until_the_index_changes(
    upstream: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = NameIndex()
    index.put(row("a1"))
    index.put(row("me", app="client", private_ip="127.0.0.1"))
    index.put(row("x1", app="theirs", scope=Scope("acme"), private_ip="fdaa::99"))
    server = await started(index, [("127.0.0.1", upstream)])
    parsed: list[str] = []
    local = server.local

    def counting(query: dns.message.Message, asker: str | None) -> dns.message.Message | None:
        parsed.append(query.question[0].name.to_text())
        return local(query, asker)

    monkeypatch.setattr(server, "local", counting)
    host, port = server.address

    async def udp(name: str, qid: int, source: str = "127.0.0.1") -> dns.message.Message:
        query = dns.message.make_query(name, "AAAA", id=qid)
        return await dns.asyncquery.udp(query, host, port=port, timeout=5, source=source)

    try:
        first, again = await udp("web.internal", 1), await udp("web.internal", 2)
        assert (first.id, again.id) == (1, 2)  # each its own id
        assert addresses(first) == addresses(again) == ["fdaa::a1"]
        assert len(parsed) == 1 and server.answered == 2  # the second was not made again
        index.put(row("a2"))  # a change: the next answer is made again, with it
        assert addresses(await udp("web.internal", 3)) == ["fdaa::a1", "fdaa::a2"]
        assert len(parsed) == 2
        # The same question from another asker: its own answer (its own network's names).
        assert (await udp("theirs.internal", 4)).rcode() == dns.rcode.NXDOMAIN
        assert (await udp("theirs.internal", 4, "127.0.0.2")).rcode() == dns.rcode.NOERROR
        assert (await udp("theirs.internal", 5)).rcode() == dns.rcode.NXDOMAIN
        server.synced = False  # the view read again: nothing kept holds
        assert (await udp("web.internal", 6)).rcode() == dns.rcode.SERVFAIL
    finally:
        await server.aclose()


def test_host_resolvers_leave_out_the_servers_own_address(tmp_path: object) -> None:
    from pathlib import Path

    conf = Path(str(tmp_path)) / "resolv.conf"
    conf.write_text("nameserver fdaa::3\nnameserver 10.0.0.2\nnameserver ::1\n")
    assert host_resolvers(str(conf), exclude=["fdaa:0::3"]) == [("10.0.0.2", 53), ("::1", 53)]
    assert host_resolvers(str(tmp_path) + "/missing") == []


async def test_a_system_chosen_port_taken_for_tcp_is_chosen_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Port 0: UDP gets a port from the system and TCP must take the same number, which a TCP
    socket may hold already. The server then tries another one instead of failing to start."""
    real = asyncio.start_server
    refused: list[int] = []

    async def taken_once(*args: Any, **kw: Any) -> asyncio.Server:
        if not refused:
            refused.append(int(args[2]))
            raise OSError(errno.EADDRINUSE, "address already in use")
        return await real(*args, **kw)

    monkeypatch.setattr(asyncio, "start_server", taken_once)
    server = await started(NameIndex(), [])
    try:
        assert refused and server.address[1] != 0
        # It answers on the port it reports, over UDP and TCP.
        assert (await ask(server, "nope.internal")).rcode() == dns.rcode.NXDOMAIN
        _, writer = await asyncio.open_connection(*server.address)
        writer.close()
        await writer.wait_closed()
    finally:
        await server.aclose()


async def test_an_answer_kept_is_sent_while_the_event_loop_is_busy(upstream: int) -> None:
    """The UDP socket's thread sends a kept answer itself: an agent's loop held by other work
    (here 1 s of a blocking call) does not hold it up."""
    import threading
    import time

    import dns.query

    index = NameIndex()
    index.put(row("a1"))
    server = await started(index, [("127.0.0.1", upstream)])
    host, port = server.address
    try:
        assert addresses(await ask(server, "web.internal")) == ["fdaa::a1"]  # now kept
        got: list[tuple[float, list[str]]] = []

        def ask_blocking() -> None:
            t0 = time.monotonic()
            query = dns.message.make_query("web.internal", "AAAA")
            answer = dns.query.udp(query, host, port=port, timeout=5)
            got.append((time.monotonic() - t0, addresses(answer)))

        asker = threading.Thread(target=ask_blocking)
        asker.start()
        time.sleep(1.0)  # the loop held: nothing of it runs meanwhile
        asker.join()
        ((elapsed, answered),) = got
        assert answered == ["fdaa::a1"] and elapsed < 0.5, elapsed
    finally:
        await server.aclose()
