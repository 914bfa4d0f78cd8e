"""examples/sched-worker.sh, the pull model's worker in POSIX sh and curl, against a real
cluster (NATS with JetStream, a broker, auth on) with no agents, so that the script is the only
worker: it takes the jobs, runs them, says how they ended and heeds a cancel."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "sched-worker.sh"
WORKER = "shell-1"


CLUSTER = ClusterSpec("shell-worker", regions={})


@pytest.fixture
def worker(cluster: Cluster, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    if shutil.which("curl") is None:
        pytest.skip("the example worker needs curl")
    log = (tmp_path / "worker.log").open("wb")
    process = subprocess.Popen(
        ["sh", str(SCRIPT), WORKER],
        env={**os.environ, "SOUQ_API": cluster.api_url},  # (and the cluster's SOUQ_TOKEN)
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its group: the script, and the job it runs
    )
    try:
        yield process
    finally:
        os.killpg(process.pid, 9)
        process.wait(timeout=10)
        log.close()


def test_the_shell_worker_runs_the_queue(
    cluster: Cluster, worker: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    client = cluster.client()
    names = [f"sh-{i}" for i in range(3)]
    for i, name in enumerate(names):
        client.submit_job({"name": name, "command": f"echo {i} > {tmp_path}/marker-{i}"})
    client.submit_job({"name": "sh-argv", "command": ["true"]})  # not for this worker
    client.submit_job({"name": "sh-fails", "command": "exit 3"})

    def ended() -> bool:
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        return all(client.job(n).state.ended for n in [*names, "sh-fails"])

    wait_until(ended, timeout=60, interval=0.2, message="the script to run the jobs")
    for i, name in enumerate(names):
        job = client.job(name)
        assert (job.state, job.worker, job.exit_code, job.attempts) == ("succeeded", WORKER, 0, 1)
        assert (tmp_path / f"marker-{i}").read_text() == f"{i}\n"
    failed = client.job("sh-fails")
    assert (failed.state, failed.exit_code, failed.worker) == ("failed", 3, WORKER)
    assert client.job("sh-argv").state == "pending"  # left to workers that run an argv

    client.submit_job({"name": "sh-long", "command": f"touch {tmp_path}/began; sleep 600"})
    wait_until(
        lambda: client.job("sh-long").state == "running" and (tmp_path / "began").exists(),
        timeout=30,
        interval=0.2,
        message="the long job running",
    )
    assert client.cancel_job("sh-long").cancel_requested
    wait_until(
        lambda: client.job("sh-long").state == "cancelled",
        timeout=30,
        interval=0.2,
        message="the script to stop the cancelled job",
    )
