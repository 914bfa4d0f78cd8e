"""A trivial DNS responder on loopback, dnspython's wire format: every ``A`` question gets one
fixed address, anything else an empty answer. The upstream the worker's DNS server forwards to
in tests (no internet), and the floor of the names benchmark (the same round trip, nothing
looked up)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator

import dns.message
import dns.rdatatype
import dns.rrset

ADDRESS = "192.0.2.7"  # TEST-NET-1: what every A question is answered


def answer(wire: bytes) -> bytes:
    query = dns.message.from_wire(wire)
    response = dns.message.make_response(query)
    question = query.question[0]
    if dns.rdatatype.to_text(question.rdtype) == "A":
        response.answer.append(dns.rrset.from_text(question.name, 60, "IN", "A", ADDRESS))
    return response.to_wire()


class _Udp(asyncio.DatagramProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.DatagramTransport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.transport.sendto(answer(data), addr)


async def serve_udp(host: str = "127.0.0.1", port: int = 0) -> asyncio.DatagramTransport:
    """The responder on UDP in the running loop; its port is ``get_extra_info("sockname")``."""
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(_Udp, local_addr=(host, port))
    return transport


@contextlib.contextmanager
def responder_thread(host: str = "127.0.0.1") -> Iterator[int]:
    """The responder on UDP in a thread of its own (for a test whose server is another
    process): yields its port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    sock.settimeout(0.1)
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                data, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            sock.sendto(answer(data), peer)

    thread = threading.Thread(target=run, name="dns-upstream", daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        sock.close()


async def _serve_forever(port: int) -> None:
    transport = await serve_udp(port=port)
    print(f"dns-upstream on 127.0.0.1:{transport.get_extra_info('sockname')[1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":  # the benchmark's floor: its own process, on uvloop as the agent is
    import sys

    try:
        import uvloop

        uvloop.run(_serve_forever(int(sys.argv[1])))
    except ImportError:
        asyncio.run(_serve_forever(int(sys.argv[1])))
