"""Storage faults: a corrupt state file is detected at start, set aside, and the agent refuses
to start with a clear message instead of forgetting its machines silently."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from souq.agent.state.store import Store
from souq.errors import StorageError
from souq.fleet.store import memory_store
from souq.model import MachineState, StopCommand
from souq.protocol import verbs as v
from tests.integration.agent_harness import APP, pid_alive, running_agent


def corrupt(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(0)
        f.write(b"this is not sqlite at all!!")


def test_a_corrupt_state_file_is_set_aside_and_the_store_refuses(tmp_path: Path) -> None:
    store = Store(tmp_path)
    worker_id = store.worker_id()
    store.close()
    corrupt(tmp_path / "state.db")
    with pytest.raises(StorageError, match="is corrupt") as caught:
        Store(tmp_path)
    aside = Path(caught.value.details["set_aside"])
    assert aside.exists() and aside.name.startswith("state.db.corrupt-")
    assert not (tmp_path / "state.db").exists()
    # It keeps refusing (no silent fresh start) until someone decides.
    with pytest.raises(StorageError, match="set aside"):
        Store(tmp_path)
    # Deleting the corrupt copy is a decision to start afresh.
    aside.unlink()
    fresh = Store(tmp_path)
    assert fresh.worker_id() != worker_id
    fresh.close()


def test_souq_agent_refuses_to_start_on_a_corrupt_state_file(tmp_path: Path) -> None:
    Store(tmp_path).close()
    corrupt(tmp_path / "state.db")
    args = ["--region", "mad", "--nats", "nats://127.0.0.1:1", "--data-dir", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "souq", "agent", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert "is corrupt" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_failed_write_fails_the_operation_cleanly(nats_url: str, tmp_path: Path) -> None:
    """A write that fails (here the connection turned read-only, as a read-only file or a full
    disk would) fails the command with ``storage_error``; nothing is half-done."""

    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            m = await h.claim(["sleep", "60"])
            db = h.agent.store._db
            db.execute("PRAGMA query_only=1")
            with pytest.raises(StorageError, match="state file failed"):
                await h.claim(["sleep", "60"])
            with pytest.raises(StorageError):
                await h.call(v.STOP, StopCommand(app=APP, machine_id=m.id))
            # Nothing happened: no new machine, no signal sent, nothing reserved.
            assert m.pid is not None and pid_alive(m.pid)
            assert (await h.get(m.id)).state is MachineState.STARTED
            assert h.agent.executor.machine_count() == 1
            assert h.agent.executor.allocated.cpus == 1
            db.execute("PRAGMA query_only=0")
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert (await h.call(v.STOP, StopCommand(app=APP, machine_id=m.id))).state in (
                MachineState.STOPPING,
                MachineState.STOPPED,
            )

    asyncio.run(body())


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files ``os.fdatasync`` is called on from now (the store's own syncs; SQLite's are
    its C library's and not seen here)."""
    files: list[str] = []
    real = os.fdatasync

    def spy(fd: int) -> None:
        files.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", spy)
    return files


def test_a_write_that_skips_its_fsync_leaves_the_sync_level_as_it_was(
    tmp_path: Path, synced: list[str]
) -> None:
    store = Store(tmp_path)
    level = lambda: store._db.execute("PRAGMA synchronous").fetchone()[0]  # noqa: E731
    assert level() == 2  # FULL: every write is fsynced unless said otherwise
    with store._write(durable=False) as db:
        assert level() == 1  # NORMAL, for this transaction only
        db.execute("INSERT OR REPLACE INTO meta VALUES ('k', 'v')")
    assert level() == 2
    assert synced == []
    store.sync()  # makes it durable: the WAL is synced, as FULL would have at its commit
    store.sync()  # the WAL file stays open between syncs
    assert synced == [str(tmp_path / "state.db-wal")] * 2
    assert store.meta("k") == "v"
    store.close()
    store = Store(tmp_path)  # the WAL reopened: the next sync opens it afresh
    assert store.meta("k") == "v"
    with store._write(durable=False) as db:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('k', 'w')")
    store.sync()
    assert synced[2:] == [str(tmp_path / "state.db-wal")]
    store.set_synchronous("OFF")  # a hollow worker's store
    with store._write(durable=False):
        assert level() == 0  # not raised to NORMAL
    assert level() == 0
    store.close()
    hollow = memory_store()
    hollow.sync()  # nothing to make durable
    assert len(synced) == 3
    hollow.close()


def test_a_claim_is_made_durable_before_it_is_answered(
    nats_url: str, tmp_path: Path, synced: list[str]
) -> None:
    """A claim commits without an fsync and syncs the WAL once before it answers (while the
    waiter forks, when it spawns); a claim that fails its spawn is made durable by the failure's
    own synced write."""
    wal = str(tmp_path / "state.db-wal")

    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            synced.clear()
            started = await h.claim(["sleep", "60"])
            assert started.state is MachineState.STARTED
            assert synced == [wal]
            created = await h.claim(["sleep", "60"], skip_launch=True)
            assert created.state is MachineState.CREATED
            assert synced == [wal] * 2
            failed = await h.claim(["/no/such/program"])
            assert failed.state is MachineState.FAILED
            assert synced == [wal] * 2  # the failure's write was a synced one
            assert not h.agent.executor._unsynced

    asyncio.run(body())
