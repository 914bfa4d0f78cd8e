"""The agent's own records: a machine row as stored, and one step of the op log."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Protocol, TypeVar

from souq.agent.capacity.admission import HeldQuote
from souq.agent.state.events import Event
from souq.agent.state.operations import OpKind, OpState
from souq.clock import iso_from_ms
from souq.errors import NotFound
from souq.model.machine import Machine, MachineConfig, MachineEvent, MachineState
from souq.model.placement import Placement
from souq.model.protocol import Quote, QuoteState
from souq.model.resources import Resources
from souq.model.services import MachineAddress

__all__ = ["RECENT_EVENTS", "HoldRow", "MachineRow", "Op", "OpStep", "Source", "of_app"]

Source = Literal["agent", "user"]  # who asked for an operation

RECENT_EVENTS = 20  # events kept on the machine record (newest first); the `events` verb has all


class _AppRecord(Protocol):
    @property
    def app(self) -> str: ...


R = TypeVar("R", bound=_AppRecord)


def of_app(record: R | None, app: str, kind: str, record_id: str, *, hint: str) -> R:
    """``record`` when it belongs to ``app``. A missing record, or another app's, is
    :class:`NotFound`: a caller never learns of records of other apps."""
    if record is None or record.app != app:
        raise NotFound(f"{kind} {record_id} not found in app {app}", hint=hint)
    return record


@dataclass(frozen=True)
class MachineRow:
    """One machine as the agent keeps it. Immutable: a change makes a new row, written to the
    store first and kept in memory only once the write committed."""

    id: str
    app: str
    name: str
    region: str
    request_id: str
    body_hash: str
    state: MachineState
    config: MachineConfig
    placement: Placement | None
    created_at: int  # ms since the epoch
    updated_at: int
    pid: int | None = None
    pid_start_time: float | None = None
    restarts: int = 0
    exit_code: int | None = None
    events: tuple[MachineEvent, ...] = ()  # newest first, at most RECENT_EVENTS
    address: MachineAddress | None = None  # its host and host ports, given at the claim
    instance_id: str = ""  # the version of its config: new at the claim and at every update
    gpu_ids: tuple[int, ...] = ()  # the worker's GPUs it got, by index (admission chose them)
    cordoned: bool = False  # out of the proxies' rotation (POST .../cordon), until uncordoned
    skip_secrets: bool = False  # started without its app's secrets (made by a token without them)

    @cached_property
    def resources(self) -> Resources:
        return self.config.guest.resources()

    def to_machine(self, worker_id: str) -> Machine:
        return Machine(
            **_shown(self, worker_id),
            name=self.name,
            state=self.state,
            updated_at=iso_from_ms(self.updated_at),
            events=list(self.events),
            restarts=self.restarts,
            pid=self.pid,
            exit_code=self.exit_code,
            address=self.address,
            instance_id=self.instance_id or self.id,
            gpu_ids=list(self.gpu_ids),
            cordoned=self.cordoned,
            skip_secrets=self.skip_secrets,
        )


@dataclass(frozen=True)
class OpStep:
    """One row of the op log: operation ``op_id`` reached ``state`` through ``event``."""

    op_id: str
    machine_id: str
    kind: OpKind
    state: OpState
    event: Event
    ts: int
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class HoldRow(HeldQuote):
    """Capacity held for a quote: from ``created_at`` until used, released or ``expires_at``.
    What admission judges a claim that names the quote by (the :class:`HeldQuote`: id, app,
    resources, expires_at, state, machine_id), and what the quote was asked with."""

    region: str
    config: MachineConfig
    placement: Placement | None
    ttl_s: float
    created_at: int  # ms since the epoch
    state: QuoteState = QuoteState.HELD

    def to_quote(self, worker_id: str) -> Quote:
        return Quote(
            **_shown(self, worker_id),
            state=self.state,
            resources=self.resources,
            ttl_s=self.ttl_s,
            expires_at=iso_from_ms(self.expires_at),
            machine_id=self.machine_id,
        )


def _shown(row: MachineRow | HoldRow, worker_id: str) -> dict[str, Any]:
    """What a machine and a quote show alike, from the row the worker keeps of either."""
    return {
        "id": row.id,
        "app": row.app,
        "region": row.region,
        "worker_id": worker_id,
        "config": row.config,
        "placement": row.placement,
        "created_at": iso_from_ms(row.created_at),
    }


@dataclass
class Op:
    """An operation in progress (its steps are in the op log)."""

    id: str
    kind: OpKind
    machine_id: str
    params: dict[str, Any]
    state: OpState = OpState.NEW
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    @property
    def source(self) -> Source:
        return "agent" if self.params.get("source") == "agent" else "user"
