"""The agent's own records: a machine row as stored, and one step of the op log."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Final, Literal, Protocol, TypedDict, TypeVar, cast

from souq.agent.capacity.admission import HeldQuote
from souq.agent.state.events import Event
from souq.agent.state.operations import OpKind, OpState
from souq.clock import iso_from_ms
from souq.errors import NotFound
from souq.model.choices import EventType
from souq.model.machine import Machine, MachineConfig, MachineEvent, MachineState
from souq.model.placement import Placement
from souq.model.protocol import Quote, QuoteState
from souq.model.resources import Resources
from souq.model.services import MachineAddress

__all__ = [
    "OP_PARAMS",
    "RECENT_EVENTS",
    "HoldRow",
    "MachineRow",
    "Op",
    "OpParams",
    "OpStep",
    "Source",
    "StopParams",
    "checked_params",
    "of_app",
]

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
    detail: Mapping[str, Any] = field(default_factory=dict)  # its operation's OpParams


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


class StopParams(TypedDict, total=False):
    """How an operation stops a machine's process (a stop, a restart, a graceful destroy)."""

    signal: str  # the stop's (or a signal operation's) signal: SEND_SIGNAL
    timeout_s: float  # SIGKILL after this long: ARM_KILL_TIMER
    drain_s: float  # out of the proxies' rotation this long before the signal: ARM_DRAIN_TIMER


class OpParams(StopParams, total=False):
    """An operation's parameters: what its actions read, kept with each of its steps in the op
    log (a step's ``detail``, which ``GET .../ops`` shows), in the order given. Which kinds
    carry which: :data:`OP_PARAMS`."""

    source: Source  # who asked: its events' source
    type: EventType  # what its spawn is published as (start; restart)


_STOPS = frozenset({"source", "signal", "timeout_s", "drain_s"})
# The parameters each kind of operation takes (a destroy takes a stop's when it is graceful).
OP_PARAMS: Final[Mapping[OpKind, frozenset[str]]] = MappingProxyType(
    {
        OpKind.CREATE: frozenset({"source", "type"}),
        OpKind.START: frozenset({"source", "type"}),
        OpKind.STOP: _STOPS,
        OpKind.RESTART: _STOPS | {"type"},
        OpKind.SIGNAL: frozenset({"source", "signal"}),
        OpKind.DESTROY: _STOPS,
    }
)


def checked_params(kind: OpKind, params: OpParams) -> OpParams:
    """``params``, if an operation of ``kind`` takes them all (:data:`OP_PARAMS`); else
    ``ValueError``, a bug in the agent."""
    extra = set(params) - OP_PARAMS[kind]
    if extra:
        raise ValueError(f"a {kind} operation takes no {', '.join(sorted(extra))}")
    return params


@dataclass
class Op:
    """An operation in progress (its steps are in the op log)."""

    id: str
    kind: OpKind
    machine_id: str
    params: OpParams
    state: OpState = OpState.NEW
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    @classmethod
    def resumed(cls, last: OpStep) -> Op:
        """The operation the op log left unfinished, at its last step ``last``."""
        params = cast("OpParams", dict(last.detail))  # as the agent that began it wrote them
        return cls(last.op_id, last.kind, last.machine_id, params, last.state)

    @property
    def source(self) -> Source:
        return "agent" if self.params.get("source") == "agent" else "user"

    @property
    def spawn_type(self) -> EventType:
        """What its spawn is published as: a start, or a restart."""
        return EventType(self.params.get("type", EventType.START))
