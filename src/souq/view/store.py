"""The cluster view's store: machines in an in-memory SQLite database, changed only by applying
what workers said (a machine record, or one event), each change kept only if it is not older than
what the row already holds.

No I/O beyond the database and no clock: :mod:`souq.view.feed` feeds it and owns the timing.

A row's *version* is the newest time (ms) the record speaks for: the machine's ``updated_at`` or
its newest event's timestamp. Events of one worker arrive in the order they happened, so a change
with an equal version is applied (two transitions in one millisecond); an older one is dropped.
A row keeps the machine's JSON in two parts: ``body`` (what events do not change: config,
placement, restarts, pid ...) and the ``state``, ``updated_at`` and ``events`` columns that
events do change, so that applying an event never parses or re-serialises the whole record.
``body_version`` is the version of the record the body came from: a record older than the row
(an event overtook it) still refreshes a body older than itself.

Destroyed machines stay as tombstones (so a late event cannot bring one back) until
:meth:`ViewStore.prune` removes them.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

import msgspec
from pydantic import TypeAdapter

from souq.bus.codec import with_members, without_members
from souq.clock import iso_from_ms
from souq.model import Machine, MachineEvent, MachineState
from souq.model.wire import MachineEventNote
from souq.view.digest import machines_digest

__all__ = ["AppCount", "ViewStore", "machine_text", "version_of"]

RECENT_EVENTS = 10  # events kept on a row changed by events alone (the worker keeps them all)
DESTROYED = MachineState.DESTROYED.value

_SCHEMA = """
CREATE TABLE machines (
    id TEXT PRIMARY KEY,
    app TEXT NOT NULL,
    worker_id TEXT NOT NULL,
    region TEXT NOT NULL,
    state TEXT NOT NULL,
    version INTEGER NOT NULL,
    body_version INTEGER NOT NULL,
    updated_at TEXT NOT NULL,
    created_at TEXT NOT NULL,
    events TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX machines_by_app ON machines (app, created_at, id);
CREATE INDEX machines_by_worker ON machines (worker_id);
"""


_MUTABLE: set[str] = {"state", "updated_at", "events"}
_EVENTS = TypeAdapter(list[MachineEvent])
_ENCODER = msgspec.json.Encoder()


def _joined(state: str, updated_at: str, events: str, body: str) -> str:
    """The machine's JSON from a row's parts (``body`` is an object without those three)."""
    head = {"state": state, "updated_at": updated_at, "events": msgspec.Raw(events)}
    return with_members(body, head, first=True).decode()


_TEXTS: OrderedDict[int, tuple[Machine, str]] = OrderedDict()
_TEXTS_KEPT = 64


def _remembered(machine: Machine) -> str | None:
    """The JSON :func:`machine_text` made of this very object, if it is still kept."""
    held = _TEXTS.get(id(machine))
    return held[1] if held is not None and held[0] is machine else None


def machine_text(machine: Machine) -> str:
    """``machine.model_dump_json()``, remembered for the same object (the last few made, first
    in first out): a broker's answer to a create and its view's row of the machine encode the
    record once."""
    text = _remembered(machine)
    if text is not None:
        return text
    text = machine.model_dump_json()
    _TEXTS[id(machine)] = (machine, text)
    if len(_TEXTS) > _TEXTS_KEPT:
        _TEXTS.popitem(last=False)
    return text


def _ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def version_of(machine: Machine) -> int:
    newest = max((e.timestamp for e in machine.events), default=0)
    return max(_ms(machine.updated_at), newest)


def _events_json(events: list[MachineEvent]) -> str:
    return _EVENTS.dump_json(events).decode()


@dataclass(frozen=True)
class AppCount:
    app: str
    machines: int
    states: dict[str, int]
    regions: list[str]


class ViewStore:
    def __init__(self, path: str = ":memory:") -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Several changes in one transaction (cheaper than one each)."""
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            self._db.execute("COMMIT")

    # -- changes -------------------------------------------------------------------------------

    def apply_machine(self, machine: Machine) -> bool:
        """Take a worker's record of a machine, unless the row is newer. True if applied."""
        version = version_of(machine)
        text = _remembered(machine)  # this process answered with it already
        if text is not None:
            body = without_members(text, _MUTABLE).decode()
        else:
            body = machine.model_dump_json(exclude=_MUTABLE)
        cur = self._db.execute(
            "INSERT INTO machines (id, app, worker_id, region, state, version, body_version,"
            " updated_at, created_at, events, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET app = excluded.app, worker_id = excluded.worker_id,"
            " region = excluded.region, state = excluded.state, version = excluded.version,"
            " body_version = excluded.body_version, updated_at = excluded.updated_at,"
            " events = excluded.events, body = excluded.body"
            " WHERE excluded.version >= machines.version",
            (
                machine.id,
                machine.app,
                machine.worker_id,
                machine.region,
                machine.state.value,
                version,
                version,
                machine.updated_at,
                machine.created_at,
                _events_json(machine.events[:RECENT_EVENTS]),
                body,
            ),
        )
        if cur.rowcount > 0:
            return True
        self._db.execute(  # an event overtook the record: its body is still the freshest
            "UPDATE machines SET body = ?, body_version = ? WHERE id = ? AND body_version < ?",
            (body, version, machine.id, version),
        )
        return False

    def apply_events(self, msgs: Sequence[MachineEventNote]) -> bool | None:
        """Apply events of one machine, oldest first, in one write: the newest that is not
        stale sets the state, and every one that is not stale joins the recent events. A
        record one of them carries (a new machine's first event) is taken first, unless the
        row already has it (this broker made the machine and applied the claim's answer).
        True if any changed the row (or the record they carried did), False if none did (all
        stale, or held already: this broker's own create, whose record had them), None if the
        machine is not in the view (the caller fetches its record)."""
        machine_id = msgs[0].machine_id
        row = self._db.execute(
            "SELECT version, events FROM machines WHERE id = ?", (machine_id,)
        ).fetchone()
        carrier = next((m for m in msgs if m.carries_record), None)
        took = False  # a record that changed the row (a config, metadata or cordon change)
        # The record is decoded only if the row does not have it already.
        if carrier is not None and (row is None or carrier.record_version() > row[0]):
            took = self.apply_machine(carrier.record())
            row = self._db.execute(
                "SELECT version, events FROM machines WHERE id = ?", (machine_id,)
            ).fetchone()
        if row is None:
            return None
        version, events = row
        fresh = [m for m in msgs if m.event.timestamp >= version]
        if not fresh:
            return took
        held = msgspec.json.decode(events)
        known = {(e["timestamp"], e["type"], e["status"]) for e in held}
        new = [
            e
            for e in (m.event.model_dump(mode="json") for m in reversed(fresh))
            if (e["timestamp"], e["type"], e["status"]) not in known
        ]
        if not new:  # the row's record has them all already (this broker's own create, or
            return took  # a record that came with its event)
        last = fresh[-1]
        ts = last.event.timestamp
        self._db.execute(
            "UPDATE machines SET state = ?, version = ?, updated_at = ?, events = ? WHERE id = ?",
            (
                last.state.value,
                ts,
                iso_from_ms(ts),
                _ENCODER.encode([*new, *held][:RECENT_EVENTS]).decode(),
                machine_id,
            ),
        )
        return True

    def reconcile_worker(self, worker_id: str, machines: Iterable[Machine], *, before: int) -> int:
        """Make the worker's rows what the worker listed (destroyed ones included): apply each
        record and drop rows the worker no longer has, unless they changed at or after
        ``before`` (ms; when the listing was asked for: a newer row came from a fresher source).
        Returns how many rows changed."""
        changed = 0
        seen: set[str] = set()
        self._db.execute("BEGIN")
        try:
            for machine in machines:
                seen.add(machine.id)
                changed += self.apply_machine(machine)
            gone = [
                mid
                for (mid,) in self._db.execute(
                    "SELECT id FROM machines WHERE worker_id = ? AND version < ?",
                    (worker_id, before),
                )
                if mid not in seen
            ]
            self._db.executemany("DELETE FROM machines WHERE id = ?", [(m,) for m in gone])
            changed += len(gone)
        finally:
            self._db.execute("COMMIT")
        return changed

    def prune(self, *, destroyed_before: int) -> int:
        """Forget tombstones of machines destroyed before ``destroyed_before`` (ms)."""
        cur = self._db.execute(
            "DELETE FROM machines WHERE state = ? AND version < ?", (DESTROYED, destroyed_before)
        )
        return cur.rowcount

    # -- queries -------------------------------------------------------------------------------

    def machine_ids(self, worker_id: str) -> list[str]:
        """The ids of the worker's rows, tombstones included."""
        return [
            str(mid)
            for (mid,) in self._db.execute(
                "SELECT id FROM machines WHERE worker_id = ?", (worker_id,)
            )
        ]

    def machine_json(self, machine_id: str) -> str | None:
        row = self._db.execute(
            "SELECT state, updated_at, events, body FROM machines WHERE id = ? AND state != ?",
            (machine_id, DESTROYED),
        ).fetchone()
        return None if row is None else _joined(*row)

    def app_rows(self, app: str, *, destroyed: bool = False) -> list[tuple[str, str]]:
        """``(worker_id, machine JSON)`` of the app's machines not destroyed (or all of them,
        with ``destroyed``, as the view still holds them), oldest first."""
        return [
            (worker_id, _joined(state, updated_at, events, body))
            for worker_id, state, updated_at, events, body in self._db.execute(
                "SELECT worker_id, state, updated_at, events, body FROM machines"
                " WHERE app = ? AND state != ? ORDER BY created_at, id",
                (app, "" if destroyed else DESTROYED),
            )
        ]

    def apps(self) -> list[AppCount]:
        """Every app with machines not destroyed: counts in all and by state, its regions."""
        apps: dict[str, AppCount] = {}
        for app, state, region, n in self._db.execute(
            "SELECT app, state, region, count(*) FROM machines WHERE state != ?"
            " GROUP BY app, state, region ORDER BY app",
            (DESTROYED,),
        ):
            entry = apps.get(app) or AppCount(app=app, machines=0, states={}, regions=[])
            entry.states[state] = entry.states.get(state, 0) + n
            if region not in entry.regions:
                entry.regions.append(region)
            apps[app] = AppCount(
                app=app, machines=entry.machines + n, states=entry.states, regions=entry.regions
            )
        return [apps[a] for a in sorted(apps)]

    def counts_by_worker(self) -> dict[str, int]:
        return dict(
            self._db.execute(
                "SELECT worker_id, count(*) FROM machines WHERE state != ? GROUP BY worker_id",
                (DESTROYED,),
            )
        )

    def counts_by_state(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT state, count(*) FROM machines GROUP BY state"))

    def digest(self, worker_id: str) -> str:
        return machines_digest(
            self._db.execute(
                "SELECT id, state, updated_at FROM machines WHERE worker_id = ? AND state != ?",
                (worker_id, DESTROYED),
            )
        )

    def digests(self, workers: Sequence[str] | None = None) -> dict[str, str]:
        """:meth:`digest` of every worker with rows (or of ``workers``), in one pass."""
        sql = "SELECT worker_id, id, state, updated_at FROM machines WHERE state != ?"
        args: list[str] = [DESTROYED]
        if workers is not None:
            sql += f" AND worker_id IN ({','.join('?' * len(workers))})"
            args += workers
        rows: dict[str, list[tuple[str, str, str]]] = {}
        for worker_id, machine_id, state, updated_at in self._db.execute(sql, args):
            rows.setdefault(worker_id, []).append((machine_id, state, updated_at))
        return {w: machines_digest(r) for w, r in rows.items()}

    def size(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM machines").fetchone()[0])

    def memory_bytes(self) -> int:
        """What SQLite holds for the view's database (pages in use)."""
        pages = self._db.execute("PRAGMA page_count").fetchone()[0]
        size = self._db.execute("PRAGMA page_size").fetchone()[0]
        return int(pages) * int(size)
