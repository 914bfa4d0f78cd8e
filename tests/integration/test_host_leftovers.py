"""What tests leave on the host (souq.testing_host): the private networks of the workers a
test process started go at its end, and a worker that left nothing costs no command; the
machines an agent left running go with its cluster."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil
import pytest

from souq import testing_host
from souq.network import links
from souq.testing import Cluster


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
        testing_host.forget_networks([clean, left])
        assert left_by == [left]  # the clean one was read, not cleaned
        assert f":{chain} " not in _chains()
    finally:
        subprocess.run(
            ["iptables", "-w", "-t", "filter", "-X", chain], capture_output=True, check=False
        )


def test_the_machines_an_agent_left_running_go_with_its_cluster(tmp_path: Path) -> None:
    with Cluster(tmp_path, regions={"solo": 0}) as c:
        agent = c.add_agent("solo", cpus=1, stop_machines_on_exit=False)
        c.wait_for_workers()
        made = c.client().create_machine("left", "solo", {"cmd": ["sleep", "600.0777"]})
        c.client().wait("left", made.id, "started", timeout=30)
        (sleeping,) = [
            p for p in psutil.process_iter(["cmdline"]) if "600.0777" in (p.info["cmdline"] or ())
        ]
        agent.stop()  # it leaves its machine running, as it was told
        assert sleeping.is_running()
    sleeping.wait(timeout=10)  # (raises while it runs)
    assert not sleeping.is_running()
