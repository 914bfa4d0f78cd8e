"""The agent's SQLite schema, the statements a claim and a start run, and the conversions between
rows and records: what :mod:`souq.agent.state.store` reads and writes, kept apart from how it runs
its transactions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from souq.agent.state.events import Event
from souq.agent.state.machine_columns import COLUMNS, column_names
from souq.agent.state.operations import OpKind, OpState
from souq.agent.state.records import HoldRow, OpStep
from souq.drivers.base import OOM_NOTE
from souq.model.choices import EventType
from souq.model.machine import MachineConfig, MachineEvent, MachineState
from souq.model.placement import Placement
from souq.model.protocol import QuoteState
from souq.model.resources import Resources

__all__ = [
    "ADDED_MACHINE_COLUMNS",
    "ADDED_RESERVATION_COLUMNS",
    "AMOUNTS",
    "EVENT_COLUMNS",
    "HOLD_COLUMNS",
    "INSERT_EVENT",
    "INSERT_MACHINE",
    "INSERT_OP",
    "INSERT_RESERVATION",
    "MACHINE_COLUMNS",
    "OP_COLUMNS",
    "REPLACE_RESERVATION",
    "SCHEMA",
    "SUMS",
    "UPDATE_MACHINE",
    "UPDATE_RESERVATION",
    "UPDATE_SPEC",
    "amounts_of",
    "event_of",
    "hold_of",
    "int_or_none",
    "op_step_of",
    "resources_of",
]

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
{machines}
CREATE TABLE IF NOT EXISTS leases (
    machine_id TEXT PRIMARY KEY,
    nonce TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    description TEXT NOT NULL,
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS reservations (
    machine_id TEXT PRIMARY KEY REFERENCES machines(id),
    millicpus INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL,
    disk_mb INTEGER NOT NULL DEFAULT 0,
    gpus INTEGER NOT NULL DEFAULT 0,
    gpu_milli INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS holds (
    id TEXT PRIMARY KEY,
    app TEXT NOT NULL,
    region TEXT NOT NULL,
    millicpus INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL,
    disk_mb INTEGER NOT NULL DEFAULT 0,
    gpus INTEGER NOT NULL DEFAULT 0,
    config TEXT NOT NULL,
    placement TEXT,
    ttl_s REAL NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    state TEXT NOT NULL,
    machine_id TEXT
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    machine_id TEXT NOT NULL,
    type TEXT NOT NULL,
    status TEXT NOT NULL,
    source TEXT NOT NULL,
    ts INTEGER NOT NULL,
    exit_code INTEGER,
    signal TEXT,
    message TEXT
);
CREATE INDEX IF NOT EXISTS events_by_machine ON events (machine_id, seq);
CREATE TABLE IF NOT EXISTS volumes (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    app TEXT NOT NULL,
    region TEXT NOT NULL,
    size_gb INTEGER NOT NULL,
    state TEXT NOT NULL,
    attached_machine_id TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    snapshot_retention INTEGER NOT NULL DEFAULT 5,
    dir TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS volumes_by_app ON volumes (app, name);
CREATE TABLE IF NOT EXISTS ops (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    op_id TEXT NOT NULL,
    machine_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    event TEXT NOT NULL,
    ts INTEGER NOT NULL,
    detail TEXT
);
""".replace(
    "{machines}",
    "CREATE TABLE IF NOT EXISTS machines (\n"
    + ",\n".join(f"    {c.name} {c.sql}" for c in COLUMNS)
    + "\n);",
)

MACHINE_COLUMNS = ", ".join(column_names())
# Columns added since the first schema, for a state file an older agent made.
ADDED_MACHINE_COLUMNS = {c.name: c.sql for c in COLUMNS if c.added}
ADDED_RESERVATION_COLUMNS = {"gpu_milli": "INTEGER NOT NULL DEFAULT 0"}  # GPU shares
EVENT_COLUMNS = "type, status, source, ts, exit_code, signal, message"
HOLD_COLUMNS = (
    "id, app, region, millicpus, memory_mb, disk_mb, gpus, config, placement, ttl_s, created_at, "
    "expires_at, state, machine_id"
)
OP_COLUMNS = "op_id, machine_id, kind, state, event, ts, detail"


# The statements of a claim and of a machine's start (:meth:`Store.prepare` compiles them).
INSERT_MACHINE = (
    f"INSERT INTO machines ({MACHINE_COLUMNS}) "  # noqa: S608 (constant columns)
    f"VALUES ({', '.join('?' * len(COLUMNS))})"
)
INSERT_RESERVATION = (
    "INSERT INTO reservations (machine_id, millicpus, memory_mb, disk_mb, gpus, gpu_milli) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
REPLACE_RESERVATION = (  # a failed machine's, taken again at its start
    "INSERT OR REPLACE INTO reservations "
    "(machine_id, millicpus, memory_mb, disk_mb, gpus, gpu_milli) VALUES (?, ?, ?, ?, ?, ?)"
)
INSERT_EVENT = (
    f"INSERT INTO events (machine_id, {EVENT_COLUMNS}) "  # noqa: S608 (constant columns)
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_OP = f"INSERT INTO ops ({OP_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"  # noqa: S608
UPDATE_MACHINE = (  # what every change of its run writes
    f"UPDATE machines SET {', '.join(f'{n} = ?' for n in column_names('run'))} "  # noqa: S608
    "WHERE id = ?"
)
# What changes only now and then (an update, a pull's record): written when it changed.
UPDATE_SPEC = (
    f"UPDATE machines SET {', '.join(f'{n} = ?' for n in column_names('spec'))} "  # noqa: S608
    "WHERE id = ?"
)
UPDATE_RESERVATION = (
    "UPDATE reservations SET millicpus = ?, memory_mb = ?, disk_mb = ?, gpus = ?, gpu_milli = ? "
    "WHERE machine_id = ?"
)


def event_of(r: Sequence[Any]) -> MachineEvent:
    return MachineEvent(
        type=str(r[0]),
        status=MachineState(r[1]),
        source="user" if r[2] == "user" else "agent",
        timestamp=int(r[3]),
        exit_code=int_or_none(r[4]),
        signal=str(r[5]) if r[5] is not None else None,
        message=str(r[6]) if r[6] is not None else None,
        oom_killed=r[0] == EventType.EXIT and r[6] is not None and OOM_NOTE in str(r[6]),
    )


AMOUNTS = "millicpus, memory_mb, disk_mb, gpus, gpu_milli"
SUMS = ", ".join(f"COALESCE(SUM({c}), 0)" for c in AMOUNTS.split(", "))


def amounts_of(r: Resources) -> tuple[int, int, int, int, int]:
    return (r.millicpus, r.memory_mb, r.disk_mb, r.gpus, r.gpu_milli)


def resources_of(r: Sequence[Any]) -> Resources:
    """Resources from (millicpus, memory_mb, disk_mb, gpus[, gpu_milli]) columns."""
    return Resources(
        cpus=int(r[0]) / 1000,
        memory_mb=int(r[1]),
        disk_mb=int(r[2]),
        gpus=int(r[3]),
        gpu_milli=int(r[4]) if len(r) > 4 else 0,
    )


def hold_of(r: Sequence[Any]) -> HoldRow:
    config = MachineConfig.model_validate_json(str(r[7]))
    return HoldRow(
        id=str(r[0]),
        app=str(r[1]),
        region=str(r[2]),
        resources=config.guest.resources(),  # the columns' amounts, with GPU share and model
        config=config,
        placement=Placement.model_validate_json(str(r[8])) if r[8] else None,
        ttl_s=float(r[9]),
        created_at=int(r[10]),
        expires_at=int(r[11]),
        state=QuoteState(r[12]),
        machine_id=str(r[13]) if r[13] is not None else None,
    )


def op_step_of(r: Sequence[Any]) -> OpStep:
    """An op step from :data:`OP_COLUMNS` (the record's fields, in order)."""
    detail = json.loads(str(r[6])) if r[6] else {}
    return OpStep(str(r[0]), str(r[1]), OpKind(r[2]), OpState(r[3]), Event(r[4]), int(r[5]), detail)


def int_or_none(v: Any) -> int | None:
    return int(v) if v is not None else None
