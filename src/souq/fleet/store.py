"""Cheap stores for hollow workers: the agent's own :class:`~souq.agent.state.store.Store` (same
schema, same transactions), kept where durability costs nothing.

* :func:`memory_store` (the default): SQLite ``:memory:``, one small database per worker. No
  file, no fsync, no file descriptor: 5,000 workers fit in one process. State dies with it, so
  it also leaves out what only a store opened again would read: the machine rows and their
  reservations (``Store.keeps_machines``). A claim still commits its events and its
  operation's step, and a start its own; the agent keeps its machines in memory, as every
  agent does, and checks a claim's request id there. Its events have no index by machine (the
  events verb scans the worker's own few rows).
* :func:`file_store` (``souq fleet --data-dir``): one ``state.db`` per worker, WAL with
  ``synchronous=OFF``: worker ids survive a restart of the fleet, but a crash of the host may
  lose the last transactions. Costs about four file descriptors per worker.

A hollow worker measures the control plane, not durability: the claim's SQLite transaction is
still there, only its fsync is gone. Each store compiles the statements of a claim when it is
made (:meth:`~souq.agent.state.store.Store.prepare`), not during its first claim: with thousands of
workers, most claims of a short run are some worker's first.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from souq.agent.state import schema as _schema
from souq.agent.state.store import Store

__all__ = ["file_store", "memory_store"]


class _MemoryStore(Store):
    fsyncs = False
    keeps_machines = False  # never reopened: the agent's memory is the only copy needed

    def __init__(self) -> None:  # no data dir, no lock file: nothing to share it with
        self.path = Path(":memory:")
        self._json_memo = {}
        self._lock_fd = -1  # Store.close() tolerates it
        self._db = sqlite3.connect(":memory:", isolation_level=None)
        self.set_synchronous("OFF")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_schema.SCHEMA)
        # One index fewer to keep at every event: the events verb scans this worker's few rows.
        self._db.execute("DROP INDEX events_by_machine")


def memory_store() -> Store:
    store = _MemoryStore()
    store.prepare()  # its first claim comes in the middle of the fleet's load
    return store


def file_store(data_dir: Path) -> Store:
    store = Store(data_dir)
    store.set_synchronous("OFF")
    store.fsyncs = False
    store.prepare()
    return store
