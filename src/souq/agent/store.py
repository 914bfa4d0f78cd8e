"""The agent's state file: ``<data_dir>/state.db``, SQLite in WAL mode with ``synchronous=FULL``.

Tables: ``meta`` (the persistent worker id), ``machines``, ``reservations`` (capacity held by a
machine from claim to destroy), ``events`` (append-only) and ``ops`` (the append-only op log: one
row per step of every operation). Every change is one transaction, so a machine's state, its
event and its op step land together or not at all. sqlite3 errors become
:class:`souq.errors.StorageError` here; nothing above this module sees them.

A lock file (``agent.lock``, ``flock``) keeps two agents off the same data dir.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from souq.agent.operations import OpEvent, OpKind, OpState
from souq.agent.records import RECENT_EVENTS, MachineRow, OpStep
from souq.errors import ClaimRefused, IdempotencyConflict, StorageError
from souq.ids import new_worker_id
from souq.model.machine import MachineConfig, MachineEvent, MachineState
from souq.model.placement import Placement
from souq.model.resources import Resources
from souq.placement.stages import shortfall

__all__ = ["Store"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS machines (
    id TEXT PRIMARY KEY,
    app TEXT NOT NULL,
    name TEXT NOT NULL,
    region TEXT NOT NULL,
    request_id TEXT NOT NULL UNIQUE,
    body_hash TEXT NOT NULL,
    state TEXT NOT NULL,
    config TEXT NOT NULL,
    placement TEXT,
    pid INTEGER,
    pid_start_time REAL,
    restarts INTEGER NOT NULL DEFAULT 0,
    exit_code INTEGER,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS reservations (
    machine_id TEXT PRIMARY KEY REFERENCES machines(id),
    millicpus INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL
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
"""

_MACHINE_COLUMNS = (
    "id, app, name, region, request_id, body_hash, state, config, placement, pid, "
    "pid_start_time, restarts, exit_code, created_at, updated_at"
)
_EVENT_COLUMNS = "type, status, source, ts, exit_code, signal, message"


def _fail(exc: sqlite3.Error) -> StorageError:
    return StorageError(
        f"the agent's state file failed: {exc}",
        hint="check the disk and the permissions of the agent's data dir",
    )


class Store:
    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / "state.db"
        self._lock_fd = _lock(data_dir / "agent.lock")
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            os.close(self._lock_fd)
            raise _fail(exc) from exc

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; any exception rolls it back."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _fail(exc) from exc
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _fail(exc) from exc
            raise

    def _read(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise _fail(exc) from exc

    # -- worker --------------------------------------------------------------------------------

    def worker_id(self) -> str:
        """This worker's id: made once, then the same for every agent on this data dir."""
        rows = self._read("SELECT value FROM meta WHERE key = 'worker_id'")
        if rows:
            return str(rows[0][0])
        with self._write() as db:
            db.execute("INSERT OR IGNORE INTO meta VALUES ('worker_id', ?)", (new_worker_id(),))
        return str(self._read("SELECT value FROM meta WHERE key = 'worker_id'")[0][0])

    def allocated(self) -> Resources:
        row = self._read(
            "SELECT COALESCE(SUM(millicpus), 0), COALESCE(SUM(memory_mb), 0) FROM reservations"
        )
        return Resources(cpus=int(row[0][0]) / 1000, memory_mb=int(row[0][1]))

    # -- machines ------------------------------------------------------------------------------

    def claim(self, row: MachineRow, capacity: Resources, steps: Sequence[OpStep]) -> str | None:
        """In one transaction: refuse a different body for a known request id, return the
        machine already made for it, or check the capacity, reserve it and record the machine
        with its events and op steps. Returns the id of an existing machine, or None."""
        with self._write() as db:
            found = db.execute(
                "SELECT id, body_hash FROM machines WHERE request_id = ?", (row.request_id,)
            ).fetchone()
            if found is not None:
                if found[1] != row.body_hash:
                    raise IdempotencyConflict(
                        f"request {row.request_id} already created machine {found[0]} "
                        "with a different body",
                        hint="use a new idempotency key for a different request",
                        details={"machine_id": found[0]},
                    )
                return str(found[0])
            used = db.execute(
                "SELECT COALESCE(SUM(millicpus), 0), COALESCE(SUM(memory_mb), 0) FROM reservations"
            ).fetchone()
            allocated = Resources(cpus=used[0] / 1000, memory_mb=used[1])
            short = shortfall(row.resources, capacity, allocated)
            if short is not None:
                raise ClaimRefused(
                    f"the machine no longer fits: {short.detail}",
                    hint="another claim took the capacity first; try another worker",
                    details={"reason": short.reason},
                )
            db.execute(
                f"INSERT INTO machines ({_MACHINE_COLUMNS}) "  # noqa: S608 (constant columns)
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.id,
                    row.app,
                    row.name,
                    row.region,
                    row.request_id,
                    row.body_hash,
                    str(row.state),
                    row.config.model_dump_json(),
                    row.placement.model_dump_json() if row.placement else None,
                    row.pid,
                    row.pid_start_time,
                    row.restarts,
                    row.exit_code,
                    row.created_at,
                    row.updated_at,
                ),
            )
            db.execute(
                "INSERT INTO reservations VALUES (?, ?, ?)",
                (row.id, row.resources.millicpus, row.resources.memory_mb),
            )
            self._append(db, row.id, reversed(row.events), steps)
        return None

    def commit(
        self,
        row: MachineRow,
        events: Sequence[MachineEvent],
        steps: Sequence[OpStep] = (),
        *,
        release: bool = False,
    ) -> None:
        """Write ``row``'s mutable fields, append its new events and op steps, and release its
        reservation when asked: one transaction."""
        with self._write() as db:
            db.execute(
                "UPDATE machines SET state = ?, pid = ?, pid_start_time = ?, restarts = ?, "
                "exit_code = ?, updated_at = ? WHERE id = ?",
                (
                    str(row.state),
                    row.pid,
                    row.pid_start_time,
                    row.restarts,
                    row.exit_code,
                    row.updated_at,
                    row.id,
                ),
            )
            self._append(db, row.id, events, steps)
            if release:
                db.execute("DELETE FROM reservations WHERE machine_id = ?", (row.id,))

    @staticmethod
    def _append(
        db: sqlite3.Connection,
        machine_id: str,
        events: Iterable[MachineEvent],
        steps: Sequence[OpStep],
    ) -> None:
        db.executemany(
            f"INSERT INTO events (machine_id, {_EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
            [
                (
                    machine_id,
                    e.type,
                    str(e.status),
                    e.source,
                    e.timestamp,
                    e.exit_code,
                    e.signal,
                    e.message,
                )
                for e in events
            ],
        )
        db.executemany(
            "INSERT INTO ops (op_id, machine_id, kind, state, event, ts, detail) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    s.op_id,
                    s.machine_id,
                    str(s.kind),
                    str(s.state),
                    str(s.event),
                    s.ts,
                    json.dumps(s.detail) if s.detail else None,
                )
                for s in steps
            ],
        )

    def load_machines(self) -> list[MachineRow]:
        """Every machine, destroyed ones included, each with its most recent events."""
        recent: dict[str, list[MachineEvent]] = {}
        for r in self._read(
            f"SELECT machine_id, {_EVENT_COLUMNS} FROM ("  # noqa: S608
            "  SELECT *, ROW_NUMBER() OVER (PARTITION BY machine_id ORDER BY seq DESC) AS n"
            "  FROM events"
            f") WHERE n <= {RECENT_EVENTS} ORDER BY machine_id, seq DESC"
        ):
            recent.setdefault(str(r[0]), []).append(_event(r[1:]))
        rows: list[MachineRow] = []
        for r in self._read(f"SELECT {_MACHINE_COLUMNS} FROM machines ORDER BY created_at"):  # noqa: S608
            mid = str(r[0])
            rows.append(
                MachineRow(
                    id=mid,
                    app=str(r[1]),
                    name=str(r[2]),
                    region=str(r[3]),
                    request_id=str(r[4]),
                    body_hash=str(r[5]),
                    state=MachineState(r[6]),
                    config=MachineConfig.model_validate_json(str(r[7])),
                    placement=Placement.model_validate_json(str(r[8])) if r[8] else None,
                    pid=_int_or_none(r[9]),
                    pid_start_time=float(r[10]) if r[10] is not None else None,
                    restarts=int(r[11]),
                    exit_code=_int_or_none(r[12]),
                    created_at=int(r[13]),
                    updated_at=int(r[14]),
                    events=tuple(recent.get(mid, ())),
                )
            )
        return rows

    def events(self, machine_id: str) -> list[MachineEvent]:
        """Every event of a machine, newest first."""
        return [
            _event(r)
            for r in self._read(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE machine_id = ? ORDER BY seq DESC",  # noqa: S608
                (machine_id,),
            )
        ]

    # -- the op log ----------------------------------------------------------------------------

    def unfinished_ops(self) -> list[OpStep]:
        """The last step of every operation that is not done, oldest first."""
        return [
            OpStep(
                op_id=str(r[0]),
                machine_id=str(r[1]),
                kind=OpKind(r[2]),
                state=OpState(r[3]),
                event=OpEvent(r[4]),
                ts=int(r[5]),
                detail=json.loads(str(r[6])) if r[6] else {},
            )
            for r in self._read(
                "SELECT op_id, machine_id, kind, state, event, ts, detail FROM ops "
                "WHERE seq IN (SELECT MAX(seq) FROM ops GROUP BY op_id) AND state != ? "
                "ORDER BY seq",
                (str(OpState.DONE),),
            )
        ]

    def op_log(self, machine_id: str) -> list[OpStep]:
        """Every op step of a machine, oldest first (for inspection and tests)."""
        return [
            OpStep(
                op_id=str(r[0]),
                machine_id=machine_id,
                kind=OpKind(r[1]),
                state=OpState(r[2]),
                event=OpEvent(r[3]),
                ts=int(r[4]),
                detail=json.loads(str(r[5])) if r[5] else {},
            )
            for r in self._read(
                "SELECT op_id, kind, state, event, ts, detail FROM ops WHERE machine_id = ? "
                "ORDER BY seq",
                (machine_id,),
            )
        ]


def _event(r: Sequence[Any]) -> MachineEvent:
    return MachineEvent(
        type=str(r[0]),
        status=MachineState(r[1]),
        source="user" if r[2] == "user" else "agent",
        timestamp=int(r[3]),
        exit_code=_int_or_none(r[4]),
        signal=str(r[5]) if r[5] is not None else None,
        message=str(r[6]) if r[6] is not None else None,
    )


def _int_or_none(v: Any) -> int | None:
    return int(v) if v is not None else None


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StorageError(
            f"another agent is using the data dir {path.parent}",
            hint="stop that agent first, or give this one its own --data-dir",
        ) from None
    return fd
