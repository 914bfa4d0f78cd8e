"""The worker's DNS server: ``.internal`` answered from the name index, the rest forwarded.

UDP and TCP on one address (``[fdaa::3]:53`` on a worker with a private network: every
machine's ``resolv.conf`` names it): TCP by asyncio's server, UDP read in a thread of its own
(:mod:`souq.network.dns_udp`) that sends kept answers at once and hands the rest to the loop.
Wire format by dnspython alone (``dns.message.from_wire``, ``make_response``, rrsets,
``to_wire``); nothing here packs a DNS message by hand. TCP's two-byte length prefix is the
stream's framing (RFC 7766), not a message.

* A question under ``.internal`` is answered by :class:`~souq.network.names.NameIndex` at once
  (authoritative, TTL ``ttl_s``), scoped by the asker's source address.
* Any other is forwarded to the host's resolvers (``/etc/resolv.conf``, this server's own
  address left out), each tried in turn within ``timeout_s`` in all; their answer is passed on
  as it is (its id the asker's), and SERVFAIL when none answers.
* A UDP answer larger than the asker can take (512 bytes, or its EDNS size) goes truncated
  (TC): the asker asks again over TCP. A message that does not parse gets no answer.
* Records go in the index's order (healthy first), not shuffled as dnspython would by default:
  a client that takes the first address takes a healthy one.
* **Answers kept rendered.** A UDP answer from the index depends on the question's bytes after
  its id (its flags, name, type, EDNS size and options), on the asker's address (its network,
  its region) and on the index as it stands; so dnspython's rendering of it is kept by those
  (at most :data:`ANSWER_CACHE`, all dropped whenever the index's ``version`` moves: a machine
  started, stopped, a region known), and the next same question from the same asker is that
  rendering with its own id in the first two bytes, nothing parsed, sent from the UDP thread
  without waiting on the event loop. A question of another asker, or after a change, is
  parsed and answered as above (in the loop), once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import dns.asyncquery
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.resolver
import dns.rrset

from souq.daemon import cancel_tasks
from souq.network.dns_udp import UdpReceiver, bound_udp
from souq.network.names import DEFAULT_TTL_S, NameIndex, Rcode, is_internal

__all__ = ["DEFAULT_LISTEN", "DnsServer", "Forwarder", "host_resolvers"]

log = logging.getLogger(__name__)
_BIND_TRIES = 8  # port 0: how many UDP ports to try before TCP takes the same one

DEFAULT_LISTEN = ("fdaa::3", 53)
UDP_DEFAULT_SIZE = 512  # an asker without EDNS takes this much over UDP
MAX_TCP_MESSAGE = 65535
RRSET_CACHE = 4096  # answers' records kept ready (each an app's answer as it stands)
ANSWER_CACHE = 8192  # UDP answers kept rendered, by question and asker (see the module)


def host_resolvers(
    path: str = "/etc/resolv.conf", *, exclude: Sequence[str] = ()
) -> list[tuple[str, int]]:
    """The nameservers the host's ``resolv.conf`` names (port 53), ``exclude`` left out (the
    server's own address: a host that points at it must not loop)."""
    try:
        resolver = dns.resolver.Resolver(filename=path, configure=True)
    except (OSError, dns.exception.DNSException) as exc:
        log.warning("cannot read the host's resolvers from %s: %s", path, exc)
        return []
    own = {_normal(a) for a in exclude}
    return [(str(ns), 53) for ns in resolver.nameservers if _normal(str(ns)) not in own]


def _normal(address: str) -> str:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).compressed
    except ValueError:
        return address


@dataclass
class Forwarder:
    """Asks the host's resolvers for what is not under ``.internal``."""

    nameservers: list[tuple[str, int]]  # (address, port), asked in order
    timeout_s: float = 2.0
    failures: int = field(default=0, init=False)

    async def ask(self, query: dns.message.Message, *, tcp: bool) -> dns.message.Message:
        """The first resolver's answer (SERVFAIL when none answers in time)."""
        deadline = time.monotonic() + self.timeout_s
        for i, (server, port) in enumerate(self.nameservers):
            # each resolver its share of the time left, so that a dead first leaves some
            left = (deadline - time.monotonic()) / (len(self.nameservers) - i)
            if left <= 0:
                break
            try:
                if tcp:
                    return await dns.asyncquery.tcp(query, server, timeout=left, port=port)
                return await dns.asyncquery.udp(
                    query, server, timeout=left, port=port, ignore_unexpected=True
                )
            except (dns.exception.DNSException, OSError, EOFError) as exc:
                log.info("the resolver %s did not answer %s: %s", server, _question(query), exc)
        self.failures += 1
        failed = dns.message.make_response(query)
        failed.set_rcode(dns.rcode.SERVFAIL)
        return failed


def _question(query: dns.message.Message) -> str:
    return query.question[0].to_text() if query.question else "(no question)"


class DnsServer:
    """``.internal`` from ``index``, the rest through ``forwarder``, on ``listen`` (UDP and
    TCP). ``start()``, then ``await aclose()``; :attr:`address` is where it listens (its
    port chosen by the system when ``listen`` gives 0)."""

    def __init__(
        self,
        index: NameIndex,
        forwarder: Forwarder,
        *,
        listen: tuple[str, int] = DEFAULT_LISTEN,
        ttl_s: int = DEFAULT_TTL_S,
    ) -> None:
        self.index = index
        self.forwarder = forwarder
        self._listen = listen
        self._ttl = ttl_s
        self._udp: UdpReceiver | None = None
        self._tcp: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.address: tuple[str, int] = listen
        self._rrsets: dict[tuple[dns.name.Name, str, tuple[str, ...]], dns.rrset.RRset] = {}
        self._answered = 0  # questions answered from the index, in the loop
        self._synced = True
        self.forwarded = 0  # questions sent to the host's resolvers
        # Rendered UDP answers without their id, by (the question after its id, the asker),
        # as of the index's version _rendered_at (see the module).
        self._rendered: dict[tuple[bytes, str], bytes] = {}
        self._rendered_at = index.version

    @property
    def answered(self) -> int:
        """Questions answered from the index (in the loop, and kept ones by the UDP thread)."""
        return self._answered + (self._udp.sent if self._udp is not None else 0)

    @property
    def synced(self) -> bool:
        """False while the index is not yet filled (its view not yet read): questions under
        .internal get SERVFAIL then, which a resolver tries again, never a false NXDOMAIN."""
        return self._synced

    @synced.setter
    def synced(self, value: bool) -> None:
        self._synced = value
        self._rendered.clear()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        host, port = self._listen
        # Port 0: the system chooses UDP's, and TCP takes the same number, which a TCP socket
        # may hold already (UDP's and TCP's ports are apart): then another number is chosen.
        for attempt in range(_BIND_TRIES if port == 0 else 1):
            sock = bound_udp(host, port)
            bound = int(sock.getsockname()[1])
            try:
                self._tcp = await asyncio.start_server(self._on_tcp, host, bound)
            except OSError as exc:
                sock.close()
                if exc.errno != errno.EADDRINUSE or attempt == _BIND_TRIES - 1 or port != 0:
                    raise
                continue
            self._udp = UdpReceiver(sock, self.kept, self.on_datagram, loop)
            self._udp.start()
            self.address = (host, bound)
            break
        log.info("the names answer on [%s]:%d (udp, tcp)", *self.address)

    async def aclose(self) -> None:
        if self._tcp is not None:
            self._tcp.close()
            self._tcp = None
        if self._udp is not None:
            udp, self._udp = self._udp, None
            self._answered += udp.sent
            await asyncio.to_thread(udp.close)
        await cancel_tasks(list(self._tasks))

    # -- answers ---------------------------------------------------------------------------------

    def local(self, query: dns.message.Message, asker: str | None) -> dns.message.Message | None:
        """The answer to a question under ``.internal`` (None: it is not, forward it)."""
        if len(query.question) != 1:
            bad = dns.message.make_response(query)
            bad.set_rcode(dns.rcode.FORMERR)
            return bad
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True).lower()
        if not is_internal(name):
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA | dns.flags.RA
        if question.rdclass != dns.rdataclass.IN:
            response.set_rcode(dns.rcode.REFUSED)
            return response
        if not self.synced:
            response.set_rcode(dns.rcode.SERVFAIL)
            return response
        answer = self.index.resolve(
            name, dns.rdatatype.to_text(question.rdtype), asker=_normal(asker) if asker else None
        )
        self._answered += 1
        if answer.rcode is Rcode.NXDOMAIN:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif answer.values:
            response.answer.append(self._rrset(question.name, answer.rdtype, answer.values))
        return response

    def _rrset(self, name: dns.name.Name, rdtype: str, values: tuple[str, ...]) -> dns.rrset.RRset:
        """The records of an answer, made once for as long as the answer stays the same (their
        parse from text is most of what a query costs): kept by name and values."""
        key = (name, rdtype, values)
        rrset = self._rrsets.get(key)
        if rrset is None:
            texts = [" ".join(f'"{v}"' for v in values)] if rdtype == "TXT" else list(values)
            rrset = dns.rrset.from_text_list(name, self._ttl, "IN", rdtype, texts)
            if len(self._rrsets) >= RRSET_CACHE:
                self._rrsets.clear()  # answers changed many times over: start again
            self._rrsets[key] = rrset
        return rrset

    async def answer(
        self, wire: bytes, asker: str | None, *, tcp: bool
    ) -> dns.message.Message | None:
        """The response to one message as received (None: it does not parse)."""
        try:
            query = dns.message.from_wire(wire)
        except dns.exception.DNSException as exc:
            log.debug("a DNS message from %s does not parse: %s", asker, exc)
            return None
        if query.flags & dns.flags.QR:
            return None  # an answer sent to us: not ours to answer
        local = self.local(query, asker)
        if local is not None:
            return local
        self.forwarded += 1
        return await self.forwarder.ask(query, tcp=tcp)

    # -- transports ------------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def kept(self, data: bytes, asker: str) -> bytes | None:
        """The kept rendering of the answer to ``data`` from ``asker``, with its id (None:
        none kept as the index now stands). Read from the UDP thread: it only reads."""
        if self._rendered_at != self.index.version:
            return None
        kept = self._rendered.get((data[2:], asker))
        return None if kept is None else data[:2] + kept

    def on_datagram(self, data: bytes, peer: Any) -> None:
        """A UDP question (in the loop): answered at once when it is ours (from its kept
        rendering when the same asker asked it since the index last changed), else in a task
        (forwarded)."""
        if self._rendered_at != self.index.version:
            self._rendered.clear()
            self._rendered_at = self.index.version
        asker = str(peer[0])
        key = (data[2:], asker)
        kept = self.kept(data, asker)
        if kept is not None and self._udp is not None:
            self._answered += 1
            self._udp.sendto(kept, peer)
            return
        try:
            query = dns.message.from_wire(data)
        except dns.exception.DNSException:
            return
        if query.flags & dns.flags.QR:
            return
        local = self.local(query, asker)
        if local is not None:
            wire = self._send_udp(local, query, peer)
            if wire is not None and wire[:2] == data[:2]:
                if len(self._rendered) >= ANSWER_CACHE:
                    self._rendered.clear()  # many askers or questions: start again
                self._rendered[key] = wire[2:]
            return
        self.forwarded += 1
        self._spawn(self._forward_udp(query, peer))

    async def _forward_udp(self, query: dns.message.Message, peer: Any) -> None:
        response = await self.forwarder.ask(query, tcp=False)
        self._send_udp(response, query, peer)

    def _send_udp(
        self, response: dns.message.Message, query: dns.message.Message, peer: Any
    ) -> bytes | None:
        """Sends the answer; returns its wire (None: the socket is closed)."""
        if self._udp is None:
            return None
        size = max(query.payload, UDP_DEFAULT_SIZE) if query.edns >= 0 else UDP_DEFAULT_SIZE
        # Too large: the answer goes without the records that do not fit, and TC set.
        wire: bytes = response.to_wire(max_size=size, prefer_truncation=True, want_shuffle=False)
        self._udp.sendto(wire, peer)
        return wire

    async def _on_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        asker = peer[0] if peer else None
        try:
            while True:  # several questions may come on one connection (RFC 7766)
                try:
                    size = int.from_bytes(await reader.readexactly(2), "big")
                    wire = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                response = await self.answer(wire, asker, tcp=True)
                if response is None:
                    return
                out = response.to_wire(max_size=MAX_TCP_MESSAGE, want_shuffle=False)
                writer.write(len(out).to_bytes(2, "big") + out)
                await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
