"""An in-memory transport with NATS's subject semantics, for unit tests and the simulator."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from souq.bus.transport import Handler, bus_unavailable
from souq.errors import NobodySubscribed, NoReply

__all__ = ["MemoryTransport", "subject_matches"]


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` matches one token, ``>`` the rest."""
    p_tokens = pattern.split(".")
    s_tokens = subject.split(".")
    for i, tok in enumerate(p_tokens):
        if tok == ">":
            return len(s_tokens) > i
        if i >= len(s_tokens) or (tok != "*" and tok != s_tokens[i]):
            return False
    return len(p_tokens) == len(s_tokens)


@dataclass
class _Sub:
    pattern: str
    handler: Handler
    queue: str | None
    bus: MemoryTransport

    async def unsubscribe(self) -> None:
        if self in self.bus._subs:
            self.bus._subs.remove(self)


class MemoryTransport:
    """All peers share one instance. Handlers run as tasks, as on NATS."""

    def __init__(self) -> None:
        self._subs: list[_Sub] = []
        self._tasks: set[asyncio.Task[bytes | None]] = set()
        self.connected_flag = True
        self.on_disconnect: list[Callable[[], Any]] = []
        self.on_reconnect: list[Callable[[], Any]] = []

    @property
    def connected(self) -> bool:
        return self.connected_flag

    async def set_connected(self, up: bool) -> None:
        """Lose the bus (``False``) or get it back (``True``), running the hooks as the NATS
        transport does: an outage in a unit test."""
        if up == self.connected_flag:
            return
        self.connected_flag = up
        for callback in list(self.on_reconnect if up else self.on_disconnect):
            result = callback()
            if asyncio.iscoroutine(result):
                await result

    def _targets(self, subject: str) -> list[_Sub]:
        out: list[_Sub] = []
        queues: set[str] = set()
        for sub in self._subs:
            if subject_matches(sub.pattern, subject):
                if sub.queue is not None:
                    if sub.queue in queues:
                        continue
                    queues.add(sub.queue)
                out.append(sub)
        return out

    def _spawn(self, sub: _Sub, subject: str, data: bytes) -> asyncio.Task[bytes | None]:
        task = asyncio.create_task(sub.handler(subject, data))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _check(self) -> None:
        if not self.connected_flag:
            raise bus_unavailable()

    async def publish(self, subject: str, data: bytes) -> None:
        self._check()
        for sub in self._targets(subject):
            self._spawn(sub, subject, data)

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        self._check()
        targets = self._targets(subject)
        if not targets:
            raise NobodySubscribed(f"nobody answers on {subject}")
        handling = self._spawn(targets[0], subject, data)
        try:
            # Awaited in a deadline, not through asyncio.wait_for: on Python 3.11 that returns the
            # reply and drops a cancellation that arrives in the same turn as the reply (the
            # cancelled caller goes on, e.g. a view's loop that then never ends).
            async with asyncio.timeout(timeout):
                reply = await handling
        except TimeoutError as exc:
            raise NoReply(f"no reply on {subject} within {timeout:g}s") from exc
        if reply is None:  # a handler that never answers: the requester's deadline passes
            await asyncio.sleep(timeout)
            raise NoReply(f"no reply on {subject} within {timeout:g}s")
        return reply

    async def gather(
        self, subject: str, data: bytes, *, expect: int | None, timeout: float
    ) -> list[bytes]:
        self._check()
        tasks = [self._spawn(sub, subject, data) for sub in self._targets(subject)]
        return await _replies(tasks, expect=expect, timeout=timeout)

    async def gather_from(
        self, subjects: Sequence[str], data: bytes, *, timeout: float
    ) -> list[bytes]:
        self._check()
        tasks = []
        for subject in subjects:
            targets = self._targets(subject)
            if targets:  # one responder per subject, as a request
                tasks.append(self._spawn(targets[0], subject, data))
        return await _replies(tasks, expect=None, timeout=timeout)

    async def subscribe(self, subject: str, handler: Handler, *, queue: str | None = None) -> _Sub:
        sub = _Sub(subject, handler, queue, self)
        self._subs.append(sub)
        return sub

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._subs.clear()


async def _replies(
    tasks: list[asyncio.Task[bytes | None]], *, expect: int | None, timeout: float
) -> list[bytes]:
    """The replies of ``tasks`` as they finish, until ``expect`` of them or ``timeout``."""
    replies: list[bytes] = []
    if not tasks:
        return replies
    try:
        async with asyncio.timeout(timeout):
            for next_done in asyncio.as_completed(tasks):
                reply = await next_done
                if reply is not None:
                    replies.append(reply)
                if expect is not None and len(replies) >= expect:
                    break
    except TimeoutError:
        pass
    return replies
