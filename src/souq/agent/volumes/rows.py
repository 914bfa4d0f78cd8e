"""The ``volumes`` table of the agent's state file (:mod:`souq.agent.state.store`): one row per
volume, destroyed ones kept (with their state) so that an id is never reused and a retried destroy
answers the same. Each change is one transaction of the store's; sqlite3 errors become
:class:`~souq.errors.StorageError` there."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from souq.agent.state.store import Store
from souq.model.volume import VolumeState

__all__ = ["VolumeRow", "VolumeRows"]

_COLUMNS = (
    "id, name, app, region, size_gb, state, attached_machine_id, created_at, updated_at, "
    "snapshot_retention, dir"
)


@dataclass(frozen=True)
class VolumeRow:
    id: str
    name: str
    app: str
    region: str
    size_gb: int
    state: VolumeState
    attached_machine_id: str | None
    created_at: int  # ms since the epoch
    updated_at: int
    snapshot_retention: int
    dir: Path  # its files, under the agent's data dir


def _row(r: Sequence[Any]) -> VolumeRow:
    return VolumeRow(
        id=str(r[0]),
        name=str(r[1]),
        app=str(r[2]),
        region=str(r[3]),
        size_gb=int(r[4]),
        state=VolumeState(r[5]),
        attached_machine_id=str(r[6]) if r[6] is not None else None,
        created_at=int(r[7]),
        updated_at=int(r[8]),
        snapshot_retention=int(r[9]),
        dir=Path(str(r[10])),
    )


class VolumeRows:
    """Reads and writes of the ``volumes`` table, through the agent's one store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def insert(self, row: VolumeRow) -> None:
        with self._store._write() as db:
            db.execute(
                f"INSERT INTO volumes ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                (
                    row.id,
                    row.name,
                    row.app,
                    row.region,
                    row.size_gb,
                    str(row.state),
                    row.attached_machine_id,
                    row.created_at,
                    row.updated_at,
                    row.snapshot_retention,
                    str(row.dir),
                ),
            )

    def get(self, volume_id: str) -> VolumeRow | None:
        rows = self._store._read(f"SELECT {_COLUMNS} FROM volumes WHERE id = ?", (volume_id,))  # noqa: S608
        return _row(rows[0]) if rows else None

    def all(self, *, app: str | None = None, live: bool = True) -> list[VolumeRow]:
        """Volumes (of ``app``), oldest first; ``live``: destroyed ones left out."""
        query = f"SELECT {_COLUMNS} FROM volumes WHERE (? IS NULL OR app = ?)"  # noqa: S608
        if live:
            query += " AND state != 'destroyed'"
        return [_row(r) for r in self._store._read(query + " ORDER BY created_at, id", (app, app))]

    def attached_to(self, machine_id: str) -> list[VolumeRow]:
        rows = self._store._read(
            f"SELECT {_COLUMNS} FROM volumes WHERE attached_machine_id = ?",  # noqa: S608
            (machine_id,),
        )
        return [_row(r) for r in rows]

    def set(self, volume_id: str, now_ms: int, **fields: object) -> None:
        """Write ``fields`` (``state``, ``size_gb``, ``attached_machine_id``,
        ``snapshot_retention``) of one volume."""
        allowed = {"state", "size_gb", "attached_machine_id", "snapshot_retention"}
        assert set(fields) <= allowed, fields
        names = ", ".join(f"{k} = ?" for k in fields)
        values = [str(v) if isinstance(v, VolumeState) else v for v in fields.values()]
        with self._store._write() as db:
            db.execute(
                f"UPDATE volumes SET {names}, updated_at = ? WHERE id = ?",  # noqa: S608
                (*values, now_ms, volume_id),
            )

    def attach(self, volume_id: str, machine_id: str | None, now_ms: int) -> bool:
        """Attach to ``machine_id`` (None: detach), only if free or already its: False when
        another machine holds it."""
        with self._store._write() as db:
            cur = db.execute(
                "UPDATE volumes SET attached_machine_id = ?, updated_at = ? WHERE id = ? AND "
                "(attached_machine_id IS NULL OR attached_machine_id = ? OR ? IS NULL)",
                (machine_id, now_ms, volume_id, machine_id, machine_id),
            )
            return cur.rowcount == 1
