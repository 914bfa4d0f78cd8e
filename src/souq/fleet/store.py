"""Cheap stores for hollow workers: the agent's own :class:`~souq.agent.store.Store` (same
schema, same transactions, same claim check), kept where durability costs nothing.

* :func:`memory_store` (the default): SQLite ``:memory:``, one small database per worker. No
  file, no fsync, no file descriptor: 5,000 workers fit in one process. State dies with it.
* :func:`file_store` (``souq fleet --data-dir``): one ``state.db`` per worker, WAL with
  ``synchronous=OFF``: worker ids survive a restart of the fleet, but a crash of the host may
  lose the last transactions. Costs about four file descriptors per worker.

A hollow worker measures the control plane, not durability: the claim's SQLite transaction is
still there, only its fsync is gone.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from souq.agent import store as _store
from souq.agent.store import Store

__all__ = ["file_store", "memory_store"]


class _MemoryStore(Store):
    fsyncs = False

    def __init__(self) -> None:  # no data dir, no lock file: nothing to share it with
        self.path = Path(":memory:")
        self._json_memo = {}
        self._lock_fd = -1  # Store.close() tolerates it
        self._db = sqlite3.connect(":memory:", isolation_level=None)
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_store._SCHEMA)


def memory_store() -> Store:
    return _MemoryStore()


def file_store(data_dir: Path) -> Store:
    store = Store(data_dir)
    store._db.execute("PRAGMA synchronous=OFF")
    store.fsyncs = False
    return store
