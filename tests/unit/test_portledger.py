"""The port ledger: processes that share one are never given the same port at once."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from souq import dev
from souq.portledger import LEDGER_ENV, LEDGER_PORTS, free_port, take_turn


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "ledger"
    monkeypatch.setenv(LEDGER_ENV, str(where))
    return where


def test_the_ledger_hands_ports_out_in_turn_from_its_range(ledger: Path) -> None:
    ledger.mkdir()
    (ledger / "ports").write_text("100\n")
    low, high = LEDGER_PORTS
    first, second = free_port(), free_port()
    assert low + 100 <= first < second <= high  # in turn (a port in use is passed over)


def test_a_port_something_listens_on_is_passed_over(ledger: Path) -> None:
    ledger.mkdir()
    low, _ = LEDGER_PORTS
    with socket.socket() as taken:
        turn = next(k for k in range(200, 400) if _bind(taken, low + k))
        taken.listen()
        (ledger / "ports").write_text(f"{turn}\n")
        assert free_port() > low + turn


def _bind(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def test_processes_sharing_a_ledger_never_get_the_same_port(ledger: Path) -> None:
    code = "from souq.portledger import free_port\nprint(*(free_port() for _ in range(200)))"
    runs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    given = [int(p) for run in runs for p in run.communicate(timeout=60)[0].split()]
    assert all(run.returncode == 0 for run in runs)
    assert len(given) == 800 and len(set(given)) == 800


def test_a_counter_comes_round_and_a_new_one_starts_anywhere(tmp_path: Path) -> None:
    turns = [take_turn(tmp_path / "c", 3) for _ in range(4)]
    assert turns[1:] == [(turns[0] + i) % 3 for i in range(1, 4)]
    assert {take_turn(tmp_path / f"new{i}", 1000) for i in range(20)} != {0}


def test_agents_blocks_follow_the_ledger_and_come_round(ledger: Path) -> None:
    ledger.mkdir()
    first, end, size = dev.PORT_BLOCKS
    assert (end - first) // size == 48
    (ledger / "agent-port-blocks").write_text("47\n")
    blocks = [dev.port_block() for _ in range(3)]
    assert blocks == [(first + 47 * size, first + 48 * size - 1), (first, first + size - 1),
                      (first + size, first + 2 * size - 1)]  # fmt: skip


def test_without_a_ledger_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LEDGER_ENV, raising=False)
    port = free_port()
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert low <= port <= high  # the kernel's ephemeral range
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free, as given
