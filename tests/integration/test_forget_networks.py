"""The suite's last clean-up (tests/conftest.py): what the private networks of the workers a
test process started left on the host goes, and a worker that left nothing costs no command."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from souq import testing
from souq.network import links


def _chains() -> str:
    return subprocess.run(
        ["iptables-save", "-t", "filter"], capture_output=True, text=True, check=True
    ).stdout


def test_a_workers_left_chain_goes_and_a_clean_worker_is_not_touched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if links.unavailable() is not None:
        pytest.fail(f"the private network cannot run here: {links.unavailable()}")
    left, clean = "forget-left-worker", "forget-clean-worker"
    chain = f"SOUQ-{links.worker_tag(left)}-FWD"
    subprocess.run(["iptables", "-w", "-t", "filter", "-N", chain], check=True)
    left_by: list[str] = []
    real = links.WorkerNetwork

    def recording(worker_id: str, state_dir: Path) -> links.WorkerNetwork:
        left_by.append(worker_id)
        return real(worker_id, state_dir)

    monkeypatch.setattr(links, "WorkerNetwork", recording)
    try:
        assert f":{chain} " in _chains()
        testing.forget_networks([clean, left])
        assert left_by == [left]  # the clean one was read, not cleaned
        assert f":{chain} " not in _chains()
    finally:
        subprocess.run(
            ["iptables", "-w", "-t", "filter", "-X", chain], capture_output=True, check=False
        )
