"""A machine's output, read from its worker: all of it so far (bounded), or followed as it
comes until it ends: the machine destroyed, or down with no restart coming (its worker says)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from souq.broker.service import BrokerService
from souq.model import LogsCommand, LogsReply
from souq.protocol import verbs as v

__all__ = ["FOLLOW_POLL_S", "LOGS_CHUNK_BYTES", "LOGS_MAX_BYTES", "follow_logs", "logs"]

LOGS_CHUNK_BYTES = 65536
LOGS_MAX_BYTES = 16 * 1024 * 1024  # a plain `logs` call returns at most this much
FOLLOW_POLL_S = 10.0  # long-poll window of each `logs` request while following


async def logs(service: BrokerService, app: str, machine_id: str) -> str:
    """The machine's output so far (at most the last ``LOGS_MAX_BYTES`` bytes read)."""
    parts: list[str] = []
    offset = 0
    size = 0
    while size < LOGS_MAX_BYTES:
        reply = await _logs(service, app, machine_id, offset, wait_s=0.0)
        if not reply.data or reply.next_offset == offset:
            break
        parts.append(reply.data)
        size += len(reply.data)  # (not next_offset - offset: the first read skips what was
        offset = reply.next_offset  # rotated out)
    return "".join(parts)


async def follow_logs(service: BrokerService, app: str, machine_id: str) -> AsyncIterator[str]:
    """The machine's output so far, then new output as it comes, until it ends (the machine
    destroyed, or stopped or failed with no restart coming: ``finished``, once drained), or
    the caller stops iterating."""
    offset = 0
    while True:
        reply = await _logs(service, app, machine_id, offset, wait_s=FOLLOW_POLL_S)
        if reply.data:
            yield reply.data
        offset = reply.next_offset
        if reply.finished and not reply.data:
            return


async def _logs(
    service: BrokerService, app: str, machine_id: str, offset: int, *, wait_s: float
) -> LogsReply:
    cmd = LogsCommand(
        app=app, machine_id=machine_id, offset=offset, max_bytes=LOGS_CHUNK_BYTES, wait_s=wait_s
    )
    return await service.calls.owner(machine_id, v.LOGS, cmd, extra_s=wait_s)
