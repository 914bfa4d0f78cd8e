"""Requests to workers over the bus: encode a command, send it, return the raw reply."""

from __future__ import annotations

from pydantic import BaseModel

from souq.bus import Transport, encode, subjects

__all__ = ["ask_worker"]


async def ask_worker(
    transport: Transport, worker_id: str, verb: str, body: BaseModel, *, timeout: float
) -> bytes:
    """Send one command to one worker and return its reply envelope; read it with
    :func:`souq.bus.unwrap_as`, which raises the worker's error as the typed error it was."""
    return await transport.request(subjects.worker(worker_id, verb), encode(body), timeout)
