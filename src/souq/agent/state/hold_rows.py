"""The ``holds`` and ``leases`` tables of the agent's state file (:mod:`souq.agent.state.store`): a
quote's hold of capacity (:mod:`souq.agent.machines.quotes`) and a machine's lease
(:mod:`souq.agent.machines.leases`). Each change is one transaction of the store's; sqlite3 errors
become :class:`~souq.errors.StorageError` there."""

from __future__ import annotations

from souq.agent.state import schema as sql
from souq.agent.state.records import HoldRow
from souq.agent.state.store import Store
from souq.model.protocol import Lease, QuoteState

__all__ = ["HoldRows", "LeaseRows"]


class HoldRows:
    """Reads and writes of the ``holds`` table, through the agent's one store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def put(self, hold: HoldRow) -> HoldRow:
        """Record a quote's hold (admission judged it); a known quote id returns the hold
        already recorded for it."""
        with self._store._write() as db:
            found = db.execute(f"SELECT {sql.HOLD_COLUMNS} FROM holds WHERE id = ?", (hold.id,))  # noqa: S608
            existing = found.fetchone()
            if existing is not None:
                return sql.hold_of(existing)
            db.execute(
                f"INSERT INTO holds ({sql.HOLD_COLUMNS}) "  # noqa: S608
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    hold.id,
                    hold.app,
                    hold.region,
                    *sql.amounts_of(hold.resources)[:4],  # holds keep no GPU share column
                    hold.config.model_dump_json(),
                    hold.placement.model_dump_json() if hold.placement else None,
                    hold.ttl_s,
                    hold.created_at,
                    hold.expires_at,
                    str(hold.state),
                    hold.machine_id,
                ),
            )
        return hold

    def get(self, quote_id: str) -> HoldRow | None:
        rows = self._store._read(f"SELECT {sql.HOLD_COLUMNS} FROM holds WHERE id = ?", (quote_id,))  # noqa: S608
        return sql.hold_of(rows[0]) if rows else None

    def in_state(self, state: QuoteState) -> list[HoldRow]:
        return [
            sql.hold_of(r)
            for r in self._store._read(
                f"SELECT {sql.HOLD_COLUMNS} FROM holds WHERE state = ?",  # noqa: S608
                (str(state),),
            )
        ]

    def end(self, quote_id: str, state: QuoteState) -> None:
        """Mark a live hold expired or released (a hold already ended stays as it was)."""
        with self._store._write() as db:
            db.execute(
                "UPDATE holds SET state = ? WHERE id = ? AND state = 'held'",
                (str(state), quote_id),
            )


class LeaseRows:
    """Reads and writes of the ``leases`` table, through the agent's one store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def all(self) -> list[Lease]:
        rows = self._store._read(
            "SELECT machine_id, nonce, expires_at, description, version FROM leases"
        )
        return [
            Lease(
                machine_id=str(r[0]),
                nonce=str(r[1]),
                expires_at=int(r[2]),
                description=str(r[3]),
                version=int(r[4]),
            )
            for r in rows
        ]

    def put(self, lease: Lease) -> None:
        with self._store._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?)",
                (lease.machine_id, lease.nonce, lease.expires_at, lease.description, lease.version),
            )

    def drop(self, machine_id: str) -> None:
        with self._store._write() as db:
            db.execute("DELETE FROM leases WHERE machine_id = ?", (machine_id,))
