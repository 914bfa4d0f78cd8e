"""The hollow fleet's stores are the agent's own Store, minus durability."""

from __future__ import annotations

from pathlib import Path

from souq.agent.state.store import Store
from souq.fleet.store import file_store, memory_store


def test_the_memory_store_has_everything_the_file_store_has(tmp_path: Path) -> None:
    real = Store(tmp_path / "real")
    mem = memory_store()
    try:
        # A Store.__init__ that grows an attribute must grow it here too.
        assert set(vars(real)) <= set(vars(mem))
        assert mem.worker_id() == mem.worker_id()
        assert mem.allocated().cpus == 0
    finally:
        real.close()
        mem.close()


def test_the_file_store_keeps_the_worker_id_without_fsync(tmp_path: Path) -> None:
    store = file_store(tmp_path / "w1")
    worker_id = store.worker_id()
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 0  # OFF
    store.close()
    again = file_store(tmp_path / "w1")
    assert again.worker_id() == worker_id
    again.close()
