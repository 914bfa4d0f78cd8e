"""Host ports as a worker resource (souq.agent.capacity.ports), and a state file from an older agent
that gains the column the addresses live in."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from souq.agent.capacity.ports import PortPool
from souq.agent.state.store import Store
from souq.errors import ClaimRefused


def test_ports_are_given_round_robin_each_to_one_machine() -> None:
    pool = PortPool(100, 104, probe=lambda _: True)
    assert pool.take("a", [8080, 9090]) == {8080: 100, 9090: 101}
    assert pool.take("b", [8080]) == {8080: 102}
    pool.give_back("a")
    # The freed ports are the last to come round again.
    assert pool.take("c", [8080, 1]) == {8080: 103, 1: 104}
    assert pool.take("d", [8080]) == {8080: 100}
    assert pool.owner(101) is None and pool.owner(103) == "c"
    assert pool.free == 1


def test_a_port_in_use_on_the_host_is_skipped() -> None:
    busy = {100}
    pool = PortPool(100, 102, probe=lambda p: p not in busy)
    assert pool.take("a", [80]) == {80: 101}


def test_too_few_free_ports_refuse_the_claim_and_take_none() -> None:
    pool = PortPool(100, 101, probe=lambda _: True)
    pool.take("a", [1])
    with pytest.raises(ClaimRefused) as err:
        pool.take("b", [1, 2])
    assert err.value.details["reason"] == "no_ports"
    assert "100-101" in err.value.message
    assert pool.free == 1  # the one it found is back


def test_restored_ports_stay_their_machines() -> None:
    pool = PortPool(100, 102, probe=lambda _: True)
    pool.restore("old", [100, 101])
    assert pool.take("new", [1]) == {1: 102}
    with pytest.raises(ClaimRefused):
        pool.take("more", [1])


def test_a_state_file_without_addresses_gains_the_column(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute(
        "CREATE TABLE machines (id TEXT PRIMARY KEY, app TEXT NOT NULL, name TEXT NOT NULL,"
        " region TEXT NOT NULL, request_id TEXT NOT NULL UNIQUE, body_hash TEXT NOT NULL,"
        " state TEXT NOT NULL, config TEXT NOT NULL, placement TEXT, pid INTEGER,"
        " pid_start_time REAL, restarts INTEGER NOT NULL DEFAULT 0, exit_code INTEGER,"
        " created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)"
    )
    db.execute(
        "INSERT INTO machines VALUES ('m1', 'web', 'm1', 'mad', 'r1', 'h', 'stopped',"
        ' \'{"cmd": ["true"]}\', NULL, NULL, NULL, 0, NULL, 1, 2)'
    )
    db.commit()
    db.close()
    store = Store(tmp_path)
    try:
        [row] = store.load_machines()
        assert row.id == "m1" and row.address is None
    finally:
        store.close()


def test_edge_ports_are_the_internal_ports_of_the_services_the_edge_routes() -> None:
    from souq.agent.capacity.ports import edge_ports
    from souq.model.machine import MachineConfig

    config = MachineConfig.model_validate(
        {
            "cmd": ["x"],
            "services": [
                {"internal_port": 8080},  # HTTP on the proxy's port (the default)
                {"internal_port": 5432, "ports": []},  # the private network's only
                {"internal_port": 6379, "ports": [{"port": 6379}]},  # raw TCP at the edge
                {"internal_port": 8080, "ports": [{"port": 443, "handlers": ["http"]}]},
            ],
            "checks": {"up": {"type": "tcp", "port": 9000}},
        }
    )
    assert edge_ports(config) == [8080, 6379]
