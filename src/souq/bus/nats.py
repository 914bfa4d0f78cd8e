"""The NATS transport (nats-py). Lower-layer errors are translated to :mod:`souq.errors` here."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from souq.bus.transport import Handler
from souq.errors import Unavailable

__all__ = ["NatsTransport", "connect"]

log = logging.getLogger(__name__)
_NO_RESPONDERS = "503"


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

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._tasks: set[asyncio.Task[None]] = set()
        self._gatherings: dict[str, _Gathering] = {}
        self._ids = itertools.count(1)
        self._inbox = nc.new_inbox()
        self._inbox_sub: Any = None
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

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        if not self._nc.is_connected:
            raise Unavailable("the NATS connection is down", hint="check that NATS is running")
        try:
            msg = await self._nc.request(subject, data, timeout=timeout)
        except nats.errors.NoRespondersError as exc:
            raise Unavailable(f"nobody answers on {subject}") from exc
        except (nats.errors.TimeoutError, TimeoutError) as exc:
            raise Unavailable(f"no reply on {subject} within {timeout:g}s") from exc
        except nats.errors.Error as exc:
            raise Unavailable(f"NATS request on {subject} failed: {exc}") from exc
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
            raise Unavailable("the NATS connection is down", hint="check that NATS is running")
        token = str(next(self._ids))
        self._gatherings[token] = gathering
        reply = f"{self._inbox}.{token}"
        try:
            for subject in subjects:  # buffered by the client: one write for the lot
                await self._nc.publish(subject, data, reply=reply)
            if gathering.expect != 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await gathering.done.wait()
        except nats.errors.Error as exc:
            where = subjects[0] if len(subjects) == 1 else f"{len(subjects)} subjects"
            raise Unavailable(f"NATS publish on {where} failed: {exc}") from exc
        finally:
            del self._gatherings[token]
        return gathering.replies

    async def _on_gather_reply(self, msg: Msg) -> None:
        gathering = self._gatherings.get(msg.subject.rsplit(".", 1)[-1])
        if gathering is None:
            return  # a late reply: its gathering is over
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
            task = asyncio.create_task(self._handle(handler, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        sub = await self._nc.subscribe(subject, queue=queue or "", cb=on_message)
        return _NatsSubscription(sub)

    async def _handle(self, handler: Handler, msg: Msg) -> None:
        try:
            reply = await handler(msg.subject, bytes(msg.data))
        except Exception:
            log.exception("handler for %s failed", msg.subject)
            return
        if reply is not None and msg.reply:
            try:
                await self._nc.publish(msg.reply, reply)
            except nats.errors.Error as exc:
                log.warning("could not reply on %s: %s", msg.subject, exc)

    async def flush(self, timeout: float = 2.0) -> None:
        try:
            await self._nc.flush(timeout=int(max(1, timeout)))
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


async def connect(url: str, *, name: str, connect_timeout: float = 5.0) -> NatsTransport:
    """Connect to NATS, retrying for ever after the first connection (the agent must outlive an
    outage of the NATS server). The first connection must succeed within ``connect_timeout``."""
    holder: dict[str, NatsTransport] = {}

    async def reconnected() -> None:
        transport = holder.get("t")
        if transport is None:
            return
        for callback in transport.on_reconnect:
            result = callback()
            if asyncio.iscoroutine(result):
                await result

    async def disconnected() -> None:
        transport = holder.get("t")
        if transport is not None and not transport.closing:
            log.warning("NATS connection lost; reconnecting")

    async def error(exc: Exception) -> None:
        log.debug("NATS error: %s", exc)

    try:
        # nats-py keeps retrying a first connection when reconnects are unlimited: bound it.
        async with asyncio.timeout(connect_timeout):
            nc = await nats.connect(
                url,
                name=name,
                connect_timeout=max(1, round(connect_timeout)),
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                reconnected_cb=reconnected,
                disconnected_cb=disconnected,
                error_cb=error,
            )
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        raise Unavailable(
            f"cannot connect to NATS at {url}: {str(exc) or 'timed out'}",
            hint="is the NATS server running?",
        ) from exc
    transport = NatsTransport(nc)
    holder["t"] = transport
    await transport._start()
    return transport
