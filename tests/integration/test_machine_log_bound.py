"""A machine's output cannot fill its worker's disk, however fast it writes: a real agent, a
real machine printing ~300 MB as fast as it can, the agent killed with SIGKILL and started
again meanwhile. Its log directory stays within twice the bound at every instant sampled, the
machine is not killed and its stream goes on, whole, through the restart."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from souq.drivers import logfile
from souq.drivers.waiter import waiter_path
from souq.limits import LOG_MAX_BYTES
from souq.model import MachineState
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec
from tests.integration.agent_harness import pid_alive

APP = "chatty"
MiB = 1 << 20
WRITTEN = 300 * MiB
SLACK = 16 * 1024  # output.log.state (and its .tmp, for an instant): a block each, and a last
# partly filled block of each file

pytestmark = pytest.mark.skipif(waiter_path() is None, reason="no C compiler for souq-waiter")


CLUSTER = ClusterSpec("logbound", regions={"mad": 1})


def on_disk(workdir: Path) -> int:
    """What the log's files take, by size and by blocks, whichever is more."""
    total = 0
    with os.scandir(workdir) as entries:
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # renamed meanwhile: counted under its new name
            total += max(st.st_size, st.st_blocks * 512)
    return total


class Sampler(threading.Thread):
    """The log directory's size, sampled as often as it can be until stopped: the largest."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(daemon=True)
        self.workdir = workdir
        self.largest = 0
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.001):
            self.largest = max(self.largest, on_disk(self.workdir))
            self.samples += 1


def logical_size(workdir: Path) -> int:
    return logfile.read_output(workdir, 0, 0)[1]


def test_a_fast_writer_stays_within_the_bound_through_an_agent_kill_9(cluster: Cluster) -> None:
    (agent,) = cluster.agents
    client = cluster.client()
    script = (
        f"dd if=/dev/zero bs=1M count={WRITTEN // MiB} status=none; echo; echo done; exec sleep 600"
    )
    m = client.create_machine(APP, "mad", {"cmd": ["sh", "-c", script]})
    workdir = agent.data_dir / "machines" / ".agent" / m.id
    sampler = Sampler(workdir)
    sampler.start()
    try:
        # Mid-stream, the agent dies; the machine goes on writing while none runs.
        wait_until(lambda: logical_size(workdir) > 30 * MiB, timeout=60, message="30 MB out")
        agent.kill()
        assert pid_alive(m.pid or 0)
        at_kill = logical_size(workdir)
        wait_until(
            lambda: logical_size(workdir) > at_kill + 30 * MiB,
            timeout=60,
            message="output going on with no agent",
        )
        agent.start()
        cluster.wait_for_workers()
        wait_until(
            lambda: logical_size(workdir) == WRITTEN + len(b"\ndone\n"),
            timeout=120,
            message="the last line",
        )
    finally:
        sampler.done.set()
        sampler.join()
    assert sampler.samples > 10
    assert sampler.largest <= 2 * LOG_MAX_BYTES + SLACK, sampler.largest
    # Not killed, not restarted: the same process, and every byte counted in the stream.
    machine = client.get_machine(APP, m.id)
    assert (machine.state, machine.pid) == (MachineState.STARTED, m.pid)
    # Both files are whole bounds' worth (the rotation is by rename at the bound), and what is
    # kept is the newest output.
    assert (workdir / logfile.ROTATED).stat().st_size == LOG_MAX_BYTES
    assert (workdir / logfile.LOG).stat().st_size <= LOG_MAX_BYTES
    assert logfile.output_start(workdir) >= WRITTEN - 2 * LOG_MAX_BYTES
    assert client.logs(APP, m.id).endswith("\x00\ndone\n")
    client.destroy(APP, m.id, force=True)
