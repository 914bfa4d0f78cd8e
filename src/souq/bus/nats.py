"""The NATS transport (nats-py). Lower-layer errors are translated to :mod:`souq.errors` here.

Outages: the client reconnects for ever, every ``reconnect_wait_s``, to the same URL. While the
connection is down, requests and gathers fail at once with :func:`souq.bus.bus_unavailable`,
and the ones already waiting when it drops are cut short with the same error (they do not sit
out their deadlines). ``on_disconnect`` and ``on_reconnect`` run when it drops and when it is
back (after the subscriptions are restored): the agent keeps its events meanwhile and announces
itself again, the broker freezes its worker table and re-syncs its view.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from souq.bus.codec import error_reply
from souq.bus.permissions import sent_by_a_role
from souq.bus.transport import Handler, bus_unavailable, cancellation_kept
from souq.errors import (
    InvalidInput,
    NobodySubscribed,
    NoReply,
    PayloadTooLarge,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "PING_INTERVAL_S",
    "RECONNECT_WAIT_S",
    "Credential",
    "NatsTransport",
    "connect",
    "nats_servers",
]

log = logging.getLogger(__name__)
_NO_RESPONDERS = "503"
RECONNECT_WAIT_S = 0.25  # between two attempts to reconnect (the attempts never stop)
# A dead server closes its connections at once; a silent network cut is noticed when
# MAX_OUTSTANDING_PINGS + 1 pings in a row go unanswered (15 s; nats-py's default is 6 min).
PING_INTERVAL_S = 5.0
MAX_OUTSTANDING_PINGS = 2


class Credential(Protocol):
    """What a daemon proves itself with (:class:`souq.auth.bus.NatsCredential`): nats-py's
    options for it (its nkey, its own inbox, the CA when the bus runs TLS)."""

    @property
    def user(self) -> str: ...

    def options(self) -> dict[str, Any]: ...


@dataclass
class _Gathering:
    expect: int | None
    replies: list[bytes] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    per_subject: bool = False  # gather_from: a "no responders" answers for one subject only
    silent: int = 0  # subjects nobody listens on (gather_from)


class _NatsSubscription:
    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def unsubscribe(self) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self._sub.unsubscribe()


class NatsTransport:
    """Wraps one NATS connection. Use :func:`connect` to make one."""

    def __init__(self, nc: Client, *, locked: bool = False) -> None:
        self._nc = nc
        # Signed in to a locked-down bus: a request is answered only from a role that may send
        # it (souq.bus.permissions.sent_by_a_role); ``refused`` counts those dropped.
        self.locked = locked
        self.refused = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._gatherings: dict[str, _Gathering] = {}
        self._ids = itertools.count(1)
        self._inbox = nc.new_inbox()
        self._inbox_sub: Any = None
        self._waits: set[asyncio.Timeout] = set()  # deadlines a lost connection cuts short
        self.on_disconnect: list[Callable[[], Any]] = []
        self.on_reconnect: list[Callable[[], Any]] = []
        self.closing = False

    async def _start(self) -> None:
        self._inbox_sub = await self._nc.subscribe(self._inbox + ".*", cb=self._on_gather_reply)

    @property
    def connected(self) -> bool:
        return bool(self._nc.is_connected)

    @property
    def client(self) -> Client:
        """The nats-py connection, for a component that must answer one message more than once
        (the hollow fleet: many workers behind one subscription)."""
        return self._nc

    async def publish(self, subject: str, data: bytes) -> None:
        try:
            await self._nc.publish(subject, data)
        except nats.errors.Error as exc:
            raise Unavailable(f"cannot publish to NATS: {exc}") from exc

    def _cut_waits(self) -> None:
        """The connection is lost: every request or gather under way ends now, unavailable."""
        now = asyncio.get_running_loop().time()
        for deadline in list(self._waits):
            with contextlib.suppress(RuntimeError):  # already expiring
                deadline.reschedule(now)

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        if not self._nc.is_connected:
            raise bus_unavailable()
        try:
            with cancellation_kept():  # (nats-py's request is a wait_for)
                async with asyncio.timeout(timeout) as deadline:
                    self._waits.add(deadline)
                    try:
                        # nats-py's own deadline is a fallback: ours (cut short on a disconnect)
                        msg = await self._nc.request(subject, data, timeout=timeout + 1)
                    finally:
                        self._waits.discard(deadline)
        except nats.errors.NoRespondersError as exc:
            raise NobodySubscribed(f"nobody answers on {subject}") from exc
        except (nats.errors.TimeoutError, TimeoutError) as exc:
            if not self._nc.is_connected:
                raise bus_unavailable() from exc
            raise NoReply(f"no reply on {subject} within {timeout:g}s") from exc
        except nats.errors.Error as exc:
            if not self._nc.is_connected:
                raise bus_unavailable() from exc
            raise Unavailable(f"NATS request on {subject} failed: {exc}") from exc
        if not self.accepts(msg):
            raise Unavailable(f"the reply on {subject} was no worker's (a JetStream delivery)")
        return bytes(msg.data)

    async def gather(
        self, subject: str, data: bytes, *, expect: int | None, timeout: float
    ) -> list[bytes]:
        return await self._collect([subject], data, _Gathering(expect=expect), timeout)

    async def gather_from(
        self, subjects: Sequence[str], data: bytes, *, timeout: float
    ) -> list[bytes]:
        if not subjects:
            return []
        gathering = _Gathering(expect=len(subjects), per_subject=True)
        return await self._collect(subjects, data, gathering, timeout)

    async def _collect(
        self, subjects: Sequence[str], data: bytes, gathering: _Gathering, timeout: float
    ) -> list[bytes]:
        """Publish ``data`` to every subject with one reply inbox, and collect the replies
        until ``gathering`` is done or ``timeout`` passes."""
        if not self._nc.is_connected:
            raise bus_unavailable()
        token = str(next(self._ids))
        self._gatherings[token] = gathering
        reply = f"{self._inbox}.{token}"
        try:
            for subject in subjects:  # buffered by the client: one write for the lot
                await self._nc.publish(subject, data, reply=reply)
            if gathering.expect != 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout) as deadline:
                        self._waits.add(deadline)
                        try:
                            await gathering.done.wait()
                        finally:
                            self._waits.discard(deadline)
        except nats.errors.Error as exc:
            if not self._nc.is_connected:
                raise bus_unavailable() from exc
            where = subjects[0] if len(subjects) == 1 else f"{len(subjects)} subjects"
            raise Unavailable(f"NATS publish on {where} failed: {exc}") from exc
        finally:
            del self._gatherings[token]
        if not self._nc.is_connected:
            raise bus_unavailable()  # cut short: the replies are not all there may be
        return gathering.replies

    async def _on_gather_reply(self, msg: Msg) -> None:
        gathering = self._gatherings.get(msg.subject.rsplit(".", 1)[-1])
        if gathering is None:
            return  # a late reply: its gathering is over
        if not self.accepts(msg):
            return  # a JetStream delivery into the inbox: no worker's answer
        if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            if not gathering.per_subject:
                gathering.done.set()
                return
            gathering.silent += 1
        else:
            gathering.replies.append(bytes(msg.data))
        answered = len(gathering.replies) + gathering.silent
        if gathering.expect is not None and answered >= gathering.expect:
            gathering.done.set()

    async def subscribe(
        self, subject: str, handler: Handler, *, queue: str | None = None
    ) -> _NatsSubscription:
        async def on_message(msg: Msg) -> None:
            if not self.accepts(msg):
                return
            task = asyncio.create_task(self._handle(handler, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        sub = await self._nc.subscribe(subject, queue=queue or "", cb=on_message)
        return _NatsSubscription(sub)

    def accepts(self, msg: Msg) -> bool:
        """Whether ``msg`` came from a client that may send it (:func:`sent_by_a_role`); one
        that did not is dropped, counted, and said (the first, then at every power of two)."""
        if sent_by_a_role(msg.subject, msg.reply, msg.headers, locked=self.locked):
            return True
        self.refused += 1
        if self.refused & (self.refused - 1) == 0:
            log.warning(
                "dropped a message on %s (reply %r): no role that may send it sent it "
                "(%d dropped so far)",
                msg.subject,
                msg.reply,
                self.refused,
            )
        return False

    async def _handle(self, handler: Handler, msg: Msg) -> None:
        try:
            reply = await handler(msg.subject, bytes(msg.data))
        except Exception:
            log.exception("handler for %s failed", msg.subject)
            return
        if reply is not None and msg.reply:
            try:
                await self._nc.publish(msg.reply, reply)
            except nats.errors.MaxPayloadError:
                await self._too_large(msg, len(reply))
            except nats.errors.Error as exc:
                log.warning("could not reply on %s: %s", msg.subject, exc)

    async def _too_large(self, msg: Msg, size: int) -> None:
        """An answer larger than a message may be: the requester is told so at once (it would
        otherwise wait out its deadline for nothing), and the log says which."""
        limit = self._nc.max_payload
        log.error("the answer on %s is %d bytes, over max_payload (%d)", msg.subject, size, limit)
        err = PayloadTooLarge(
            f"the answer on {msg.subject} is {size} bytes, more than one NATS message holds "
            f"({limit})",
            hint="ask for less at once (see docs/limits.md)",
        )
        with contextlib.suppress(nats.errors.Error):
            await self._nc.publish(msg.reply, error_reply(err))

    async def flush(self, timeout: float = 2.0) -> None:
        try:
            await flush_subscriptions(self._nc, timeout)
        except (nats.errors.Error, TimeoutError) as exc:
            raise Unavailable(f"NATS flush failed: {exc}") from exc

    async def close(self) -> None:
        self.closing = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if not self._nc.is_closed:
            try:
                await self._nc.drain()
            except (nats.errors.Error, TimeoutError):
                await self._nc.close()


async def flush_subscriptions(nc: Client, timeout: float = 2.0) -> None:
    """Once this returns the server has every subscription made on `nc` before it.

    nats-py writes a flush's PING straight to the socket, ahead of commands still queued for
    its flusher task (a SUB just made), so one PONG proves nothing about them. The flusher was
    woken when they were queued and has written them by the time the first PONG is read; the
    second PING follows them."""
    for _ in range(2):
        await nc.flush(timeout=int(max(1, timeout)))


def _refused(exc: BaseException) -> bool:
    """NATS turned the client away: no credential, or one it does not know."""
    text = str(exc).lower()
    return isinstance(exc, nats.errors.AuthorizationError) or "authorization" in text


async def _run_hooks(hooks: list[Callable[[], Any]], what: str) -> None:
    for callback in list(hooks):
        try:
            result = callback()
            if asyncio.iscoroutine(result):
                await result
        except Exception:  # one failing hook must not keep the others from running
            log.exception("a NATS %s hook failed", what)


def nats_servers(url: str) -> list[str]:
    """The servers of a ``--nats`` value: one URL, or several comma-separated."""
    servers = [u.strip() for u in url.split(",") if u.strip()]
    if not servers:
        raise InvalidInput(
            f"{url!r} names no NATS server", hint="give nats://HOST:PORT[,nats://HOST:PORT...]"
        )
    return servers


async def connect(
    url: str,
    *,
    name: str,
    connect_timeout: float = 5.0,
    reconnect_wait_s: float = RECONNECT_WAIT_S,
    ping_interval_s: float = PING_INTERVAL_S,
    credential: Credential | None = None,
) -> NatsTransport:
    """Connect to NATS, retrying for ever after the first connection, every
    ``reconnect_wait_s`` (agents and brokers must outlive an outage of the NATS server). The
    first connection must succeed within ``connect_timeout``. With a ``credential`` the
    connection (and every reconnection) signs in as its user; a refusal is not retried.

    ``url`` may list several servers, comma-separated (the nodes of a NATS cluster): the first
    connection takes the first that answers (in a random order, so that daemons spread over
    the nodes), and a connection lost moves to another."""
    servers = nats_servers(url)
    holder: dict[str, NatsTransport] = {}

    async def reconnected() -> None:
        transport = holder.get("t")
        if transport is None:
            return
        log.warning("NATS connection re-established")
        await _run_hooks(transport.on_reconnect, "reconnect")

    async def disconnected() -> None:
        transport = holder.get("t")
        if transport is None or transport.closing:
            return
        log.warning("NATS connection lost; reconnecting every %gs", reconnect_wait_s)
        transport._cut_waits()
        await _run_hooks(transport.on_disconnect, "disconnect")

    errors: list[Exception] = []  # why a first connection failed: a refusal, else the last one

    async def error(exc: Exception) -> None:
        # The server answers a refused CONNECT and then resets the connection: the reset
        # must not hide the refusal.
        if holder.get("t") is None and not (errors and _refused(errors[0])):
            errors[:] = [exc]
        if _refused(exc):
            log.error("NATS refused this client: %s", exc)
        else:
            log.debug("NATS error: %s", exc)

    try:
        # nats-py keeps retrying a first connection when reconnects are unlimited: bound it.
        async with asyncio.timeout(connect_timeout):
            nc = await nats.connect(
                servers,
                name=name,
                connect_timeout=max(1, round(connect_timeout)),
                max_reconnect_attempts=-1,
                reconnect_time_wait=reconnect_wait_s,
                ping_interval=ping_interval_s,
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                reconnected_cb=reconnected,
                disconnected_cb=disconnected,
                error_cb=error,
                **(credential.options() if credential is not None else {}),
            )
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        cause = errors[-1] if errors else exc
        if _refused(cause) or _refused(exc):
            who = f"the {credential.user} credential" if credential else "a client without one"
            raise Unauthorized(
                f"NATS at {url} refused {who}: {cause}",
                hint="connect with this cluster's auth directory (--auth-dir DIR)",
            ) from exc
        raise Unavailable(
            f"cannot connect to NATS at {url}: {str(exc) or 'timed out'}",
            hint="is the NATS server running?",
        ) from exc
    transport = NatsTransport(nc, locked=credential is not None)
    holder["t"] = transport
    await transport._start()
    return transport
