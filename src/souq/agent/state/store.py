"""The agent's state file: ``<data_dir>/state.db``, SQLite in WAL mode with ``synchronous=FULL``.

Tables: ``meta`` (the persistent worker id, whether it is cordoned), ``machines``, ``volumes``
(read and written by :mod:`souq.agent.volumes.rows`),
``reservations`` (capacity held by a machine from claim to destroy), ``holds`` (capacity held by a
quote until it is used, released or expires) and ``leases`` (both read and written by
:mod:`souq.agent.state.hold_rows`), ``events`` (append-only) and ``ops`` (the
append-only op log: one row per step of every operation). Every change is one transaction,
so a machine's state, its event and its op step land together or not at all. sqlite3 errors become
:class:`souq.errors.StorageError` here; nothing above this module sees them.

Some writes are not fsynced when they commit (``durable=False``, ``synchronous=NORMAL`` for that
one transaction). Like every other write they reach the operating system at once (WAL), so they
survive a crash or kill -9 of the agent; only a power loss or kernel crash could drop them, and
that also ends every process they could describe:

* the record that a process was spawned (:meth:`Store.commit`): after a power loss the
  operation resumes from its last durable step (the spawn intended) and spawns again;
* a claim (:meth:`Store.claim`): :meth:`Store.sync` makes it durable before it is answered. A single
  claim syncs while souq-waiter forks its process (see
  :meth:`souq.agent.machines.executor.Executor.create`), a batch once for all its machines. A power
  loss before that ends the machines too, and the broker, never answered, reports the claim failed.

:meth:`Store.sync` is an ``fdatasync`` of the WAL: what ``synchronous=FULL`` does at each commit,
without a transaction of its own. The next durable write syncs them anyway.

A lock file (``agent.lock``, ``flock``) keeps two agents off the same data dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from souq.agent.state import machine_columns as columns
from souq.agent.state import schema as sql
from souq.agent.state.file import SET_ASIDE_HINT, lock, private, refuse_set_aside
from souq.agent.state.operations import OpState
from souq.agent.state.records import RECENT_EVENTS, MachineRow, OpStep
from souq.errors import (
    IdempotencyConflict,
    StorageError,
)
from souq.ids import new_worker_id
from souq.model.machine import MachineEvent, MachineState
from souq.model.resources import Resources

__all__ = ["Store"]


class _Prepared(Exception):
    """Rolls back :meth:`Store.prepare`'s transaction."""


def _fail(exc: sqlite3.Error) -> StorageError:
    return StorageError(
        f"the agent's state file failed: {exc}",
        hint="check the disk and the permissions of the agent's data dir",
    )


_SYNC_LEVELS = {"OFF": 0, "NORMAL": 1, "FULL": 2, "EXTRA": 3}
_JSON_MEMO = 8  # JSON texts remembered (Store.json_of)
_CORDONED, _DRAINING = "cordoned", "draining"  # the worker's flags' keys in `meta`
_NORMAL = _SYNC_LEVELS["NORMAL"]


class Store:
    fsyncs = True  # False for a hollow worker's store (synchronous=OFF): :meth:`sync` is a no-op
    # False for a store that is never opened again (a hollow worker's, in memory): machine rows
    # and reservations are read only when a store is opened (load_machines, allocated), so it
    # writes none; events, op steps, holds and meta are written as ever (verbs read them).
    keeps_machines = True
    _wal_fd: int | None = None  # the WAL, opened by the first :meth:`sync`

    def __init__(self, data_dir: Path) -> None:
        self._json_memo: dict[int, tuple[object, str]] = {}
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / "state.db"
        self._lock_fd = lock(data_dir / "agent.lock")
        try:
            refuse_set_aside(self.path)
            private(self.path)
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._check_integrity()
            self._db.execute("PRAGMA journal_mode=WAL")
            self.set_synchronous("FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute("PRAGMA cache_size=-256")
            self._db.executescript(sql.SCHEMA)
            self._add_columns()
        except sqlite3.Error as exc:
            os.close(self._lock_fd)
            raise _fail(exc) from exc
        except StorageError:
            os.close(self._lock_fd)
            raise

    def _add_columns(self) -> None:
        """Bring a state file an older agent made up to this schema (new columns only)."""
        for table, added in (
            ("machines", sql.ADDED_MACHINE_COLUMNS),
            ("reservations", sql.ADDED_RESERVATION_COLUMNS),
        ):
            have = {str(r[1]) for r in self._db.execute(f"PRAGMA table_info({table})")}
            for column, kind in added.items():
                if column not in have:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    def _check_integrity(self) -> None:
        """``PRAGMA quick_check`` at start: a corrupt state file is renamed aside (with a
        timestamp) and the agent refuses to start, rather than forget its machines silently."""
        try:
            rows = self._db.execute("PRAGMA quick_check").fetchall()
            problem = None if [tuple(r) for r in rows] == [("ok",)] else str(rows[:3])
        except sqlite3.DatabaseError as exc:  # e.g. "file is not a database"
            problem = str(exc)
        if problem is None:
            return
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
        raise StorageError(
            f"the agent's state file {self.path} is corrupt ({problem}); it was moved to {aside}",
            hint=SET_ASIDE_HINT,
            details={"set_aside": str(aside)},
        )

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        if self._wal_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._wal_fd)
            self._wal_fd = None
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)

    def set_synchronous(self, level: str) -> None:
        """``PRAGMA synchronous=level`` from now on (a hollow worker's store: ``OFF``). The store
        remembers it: a write with ``durable=False`` lowers it to ``NORMAL`` for its own
        transaction only, and never raises it."""
        try:
            self._db.execute(f"PRAGMA synchronous={_SYNC_LEVELS[level]}")
        except sqlite3.Error as exc:
            raise _fail(exc) from exc
        self._sync_level = _SYNC_LEVELS[level]

    @contextlib.contextmanager
    def _write(self, *, durable: bool = True) -> Iterator[sqlite3.Cursor]:
        """One ``BEGIN IMMEDIATE`` transaction; any exception rolls it back. ``durable=False``:
        not fsynced at commit (see the module's docstring for the one use): ``synchronous`` is
        ``NORMAL`` for this transaction, unless the store syncs less than that already."""
        relaxed = not durable and self._sync_level > _NORMAL
        try:
            db = self._db.cursor()  # one for the transaction's statements
            if relaxed:
                db.execute("PRAGMA synchronous=NORMAL")
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if relaxed:
                self._restore_sync_level()
            raise _fail(exc) from exc
        try:
            yield db
            db.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _fail(exc) from exc
            raise
        finally:
            if relaxed:
                self._restore_sync_level()

    def _restore_sync_level(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.execute(f"PRAGMA synchronous={self._sync_level}")

    def prepare(self) -> None:
        """Compile the statements of a claim and of a machine's start now (in a transaction
        that is rolled back), rather than at the first claim: a hollow fleet's worker makes its
        first claim long after it started, in the middle of the fleet's load."""
        try:
            with self._write() as db:
                if self.keeps_machines:
                    db.execute(sql.INSERT_MACHINE, columns.placeholders())
                    db.execute(sql.INSERT_RESERVATION, ("-", 0, 0, 0, 0, 0))
                    db.execute(sql.UPDATE_MACHINE, (*columns.placeholders("run"), "-"))
                db.executemany(sql.INSERT_EVENT, [("-", "", "", "", 0, None, None, None)])
                db.executemany(sql.INSERT_OP, [("", "-", "", "", "", 0, None)])
                raise _Prepared
        except _Prepared:
            pass

    def _read(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise _fail(exc) from exc

    # -- worker --------------------------------------------------------------------------------

    def worker_id(self, adopt: str | None = None) -> str:
        """This worker's id: made once (``adopt``: that one, its credential's), then the same
        for every agent on this data dir."""
        rows = self._read("SELECT value FROM meta WHERE key = 'worker_id'")
        if rows:
            return str(rows[0][0])
        with self._write() as db:
            new = adopt or new_worker_id()
            db.execute("INSERT OR IGNORE INTO meta VALUES ('worker_id', ?)", (new,))
        return str(self._read("SELECT value FROM meta WHERE key = 'worker_id'")[0][0])

    def meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def flags(self) -> tuple[bool, bool]:
        """The worker's flags, kept across agent restarts: whether it is cordoned, and whether
        it is draining."""
        return self.meta(_CORDONED) == "1", self.meta(_DRAINING) == "1"

    def set_flags(self, *, cordoned: bool, draining: bool) -> None:
        with self._write() as db:
            db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [(_CORDONED, "1" if cordoned else "0"), (_DRAINING, "1" if draining else "0")],
            )

    def unreserved(self) -> set[str]:
        """The machines that hold no reservation (a failed one, or one stopped or being destroyed
        since it failed: souq.agent.capacity.admission.reserves), destroyed ones left out."""
        if not self.keeps_machines:
            return set()
        rows = self._read(
            "SELECT id FROM machines WHERE state = ? OR (state != ? AND id NOT IN "
            "(SELECT machine_id FROM reservations))",
            ("failed", "destroyed"),
        )
        return {str(r[0]) for r in rows}

    def allocated(self) -> Resources:
        """What the machines and the volumes reserve (holds not included)."""
        # (A failed machine holds nothing, whatever an older version left in the table.)
        machines = sql.resources_of(
            self._read(
                f"SELECT {sql.SUMS} FROM reservations WHERE machine_id NOT IN "  # noqa: S608
                "(SELECT id FROM machines WHERE state = ?)",
                ("failed",),
            )[0]
        )
        volumes = self._read(
            "SELECT COALESCE(SUM(size_gb), 0) FROM volumes WHERE state != ?", ("destroyed",)
        )
        return machines.plus(Resources(cpus=0, memory_mb=0, disk_mb=int(volumes[0][0]) * 1024))

    # -- machines ------------------------------------------------------------------------------

    def claim(
        self,
        row: MachineRow,
        steps: Sequence[OpStep],
        *,
        quote_id: str | None = None,
        durable: bool = True,
    ) -> str | None:
        """In one transaction: refuse a different body for a known request id, return the
        machine already made for it, or record the machine, its reservation (or mark the quote
        whose hold it takes used), its events and op steps. Admission judged the claim before
        (:mod:`souq.agent.capacity.admission`). Returns the id of an existing machine, or None.
        ``durable=False``: not fsynced (a batch syncs once, :meth:`sync`)."""
        with self._write(durable=durable) as db:
            if self.keeps_machines:
                existing = self._insert_machine(db, row)
                if existing is not None:
                    return existing
            if quote_id is not None:
                db.execute(
                    "UPDATE holds SET state = 'used', machine_id = ? WHERE id = ?",
                    (row.id, quote_id),
                )
            if self.keeps_machines:
                db.execute(sql.INSERT_RESERVATION, (row.id, *sql.amounts_of(row.resources)))
            self._append(db, row.id, reversed(row.events), steps)
        return None

    def _insert_machine(self, db: sqlite3.Cursor, row: MachineRow) -> str | None:
        """Insert the machine's row; if its request id is known, the id of the machine made
        for it (:class:`IdempotencyConflict` for a different body)."""
        try:
            db.execute(
                sql.INSERT_MACHINE,
                columns.values_of(row, self.json_of),
            )
        except sqlite3.IntegrityError:
            # request_id is UNIQUE: the insert itself finds a known request (one statement
            # fewer than looking first, for every claim that is new).
            found = db.execute(
                "SELECT id, body_hash FROM machines WHERE request_id = ?", (row.request_id,)
            ).fetchone()
            if found is None:
                raise
            if found[1] != row.body_hash:
                raise IdempotencyConflict.other_body(row.request_id, found[0]) from None
            return str(found[0])
        return None

    def json_of(self, value: BaseModel | Mapping[str, Any]) -> str:
        """``value`` (a model, or an operation's params) as JSON, remembered for the same
        object: a batch's machines share one config and one placement record, serialised once;
        a claim's reply and launch event reuse them (:mod:`souq.agent.wire`); every step of an
        operation logs the same params."""
        held = self._json_memo.pop(id(value), None)
        if held is not None and held[0] is value:
            self._json_memo[id(value)] = held  # the most recent now
            return held[1]
        text = value.model_dump_json() if isinstance(value, BaseModel) else json.dumps(value)
        if len(self._json_memo) >= _JSON_MEMO:
            del self._json_memo[next(iter(self._json_memo))]  # the least recently used
        self._json_memo[id(value)] = (value, text)
        return text

    def sync(self) -> None:
        """Make every transaction so far durable: ``fdatasync`` the WAL, as ``synchronous=FULL``
        does at each commit (the transactions committed with ``durable=False`` are all in it, or
        already checkpointed into the database file, which a checkpoint syncs). It releases the
        GIL: the agent runs it while souq-waiter forks."""
        if not self.fsyncs:
            return
        try:
            fd = self._wal_fd
            if fd is None or os.fstat(fd).st_nlink == 0:  # not open yet, or the WAL was replaced
                if fd is not None:
                    os.close(fd)
                    self._wal_fd = None
                fd = self._wal_fd = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
            os.fdatasync(fd)
        except OSError as exc:
            raise StorageError(
                f"cannot make the agent's state file {self.path} durable: {exc.strerror or exc}",
                hint="check the disk under the agent's data dir (full? read-only?)",
            ) from exc

    def commit(
        self,
        row: MachineRow,
        events: Sequence[MachineEvent],
        steps: Sequence[OpStep] = (),
        *,
        release: bool = False,
        durable: bool = True,
        spec: bool = False,
        reserve: Resources | None = None,
        regain: bool = False,
    ) -> None:
        """Write ``row``'s mutable fields (its config, placement, address and instance id too
        when ``spec``), append its new events and op steps, and release its reservation or set
        it to ``reserve`` when asked (made anew with ``regain``: one released before): one
        transaction (fsynced unless ``durable=False``)."""
        with self._write(durable=durable) as db:
            if self.keeps_machines:
                db.execute(
                    sql.UPDATE_MACHINE,
                    (*columns.values_of(row, self.json_of, "run"), row.id),
                )
            if spec and self.keeps_machines:
                db.execute(
                    sql.UPDATE_SPEC,
                    (*columns.values_of(row, self.json_of, "spec"), row.id),
                )
            if reserve is not None and regain and self.keeps_machines:
                db.execute(sql.REPLACE_RESERVATION, (row.id, *sql.amounts_of(reserve)))
            elif reserve is not None and self.keeps_machines:
                db.execute(sql.UPDATE_RESERVATION, (*sql.amounts_of(reserve), row.id))
            self._append(db, row.id, events, steps)
            if (release or row.state is MachineState.DESTROYED) and self.keeps_machines:
                db.execute("DELETE FROM reservations WHERE machine_id = ?", (row.id,))

    def _append(
        self,
        db: sqlite3.Cursor,
        machine_id: str,
        events: Iterable[MachineEvent],
        steps: Sequence[OpStep],
    ) -> None:
        db.executemany(
            sql.INSERT_EVENT,
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
            sql.INSERT_OP,
            [
                (
                    s.op_id,
                    s.machine_id,
                    str(s.kind),
                    str(s.state),
                    str(s.event),
                    s.ts,
                    self.json_of(s.detail) if s.detail else None,
                )
                for s in steps
            ],
        )

    def load_machines(self) -> list[MachineRow]:
        """Every machine, destroyed ones included, each with its most recent events."""
        recent: dict[str, list[MachineEvent]] = {}
        for r in self._read(
            f"SELECT machine_id, {sql.EVENT_COLUMNS} FROM ("  # noqa: S608
            "  SELECT *, ROW_NUMBER() OVER (PARTITION BY machine_id ORDER BY seq DESC) AS n"
            "  FROM events"
            f") WHERE n <= {RECENT_EVENTS} ORDER BY machine_id, seq DESC"
        ):
            recent.setdefault(str(r[0]), []).append(sql.event_of(r[1:]))
        rows: list[MachineRow] = []
        for r in self._read(f"SELECT {sql.MACHINE_COLUMNS} FROM machines ORDER BY created_at"):  # noqa: S608
            rows.append(columns.row_of(r, recent.get(str(r[0]), ())))
        return rows

    def events(self, machine_id: str) -> list[MachineEvent]:
        """Every event of a machine, newest first."""
        return [
            sql.event_of(r)
            for r in self._read(
                f"SELECT {sql.EVENT_COLUMNS} FROM events WHERE machine_id = ? ORDER BY seq DESC",  # noqa: S608
                (machine_id,),
            )
        ]

    # -- the op log ----------------------------------------------------------------------------

    def unfinished_ops(self) -> list[OpStep]:
        """The last step of every operation that is not done, oldest first."""
        return [
            sql.op_step_of(r)
            for r in self._read(
                f"SELECT {sql.OP_COLUMNS} FROM ops "  # noqa: S608
                "WHERE seq IN (SELECT MAX(seq) FROM ops GROUP BY op_id) AND state != ? "
                "ORDER BY seq",
                (str(OpState.DONE),),
            )
        ]

    def op_log(self, machine_id: str) -> list[OpStep]:
        """Every op step of a machine, oldest first (for inspection and tests)."""
        query = f"SELECT {sql.OP_COLUMNS} FROM ops WHERE machine_id = ? ORDER BY seq"  # noqa: S608
        return [sql.op_step_of(r) for r in self._read(query, (machine_id,))]
