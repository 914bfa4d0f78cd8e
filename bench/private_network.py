"""The private network's cost at a machine's create (``python -m bench private_network``):
the same sandboxed create on two root agents of one cluster, one with ``--private-network
on`` and one without, interleaved, timed from the API's create until the record says
``started`` (``wait``), median over the rounds; then the network's part alone: a machine's
namespace, veth pair, addresses, routes and rules made (:meth:`WorkerNetwork.ensure`) and
removed, in this process."""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from souq.model.machine import MachineState
from souq.network import links
from souq.network.addresses import AddressPool
from souq.testing import Cluster

ROUNDS = int(os.environ.get("SOUQ_BENCH_ROUNDS", "20"))


def _creates(cluster: Cluster, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"on": [], "off": []}
    regions = {"on": "mad", "off": "ams"}
    app = "bn" + uuid.uuid4().hex[:8]
    with cluster.client() as client:
        for i in range(rounds):
            for kind in ("on", "off") if i % 2 == 0 else ("off", "on"):
                config = {"guest": {"memory_mb": 64}, "cmd": ["/bin/sleep", "600"]}
                start = time.perf_counter()
                m = client.create_machine(app, regions[kind], config)
                client.wait(app, m.id, MachineState.STARTED, timeout=60)
                times[kind].append((time.perf_counter() - start) * 1000)
                client.destroy(app, m.id, force=True)
    return times


def _alone(rounds: int, net: links.WorkerNetwork | None = None) -> tuple[list[float], list[float]]:
    """``rounds`` namespaces made and removed, each timed (ms); the worker's chains gone after."""
    if net is None:
        net = links.WorkerNetwork("bench-" + uuid.uuid4().hex[:6], Path(tempfile.mkdtemp()))
    pool = AddressPool("bench")
    net.start([])
    made, removed = [], []
    try:
        for i in range(rounds):
            address = pool.take(f"m{i}", "bench")
            start = time.perf_counter()
            net.ensure(f"m{i}", address)
            made.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            net.remove(f"m{i}", address)
            removed.append((time.perf_counter() - start) * 1000)
    finally:
        net.stop_rules()
    return made, removed


def main() -> None:
    why = links.unavailable()
    if why is not None:
        print(f"private network: skipped ({why})")
        return
    root = Path(tempfile.mkdtemp(prefix="souq-bench-pnet-", dir="/var/tmp"))
    root.chmod(0o711)
    try:
        with Cluster(root, regions={}) as c:
            c.add_agent("mad", machine_user=None, default_driver=None,
                        extra_args=["--private-network", "on"])  # fmt: skip
            c.add_agent("ams", machine_user=None, default_driver=None)
            c.wait_for_workers()
            times = _creates(c, ROUNDS)
            worker = c.agents[0].worker_id or ""
        links.WorkerNetwork(worker, root / "x").stop_rules()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    made, removed = _alone(ROUNDS)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    print(f"private network, {ROUNDS} sandboxed creates each, create -> started (median ms):")
    print(f"  network on   {on:7.1f}")
    print(f"  network off  {off:7.1f}")
    print(f"  added        {on - off:7.1f}")
    print(f"  the network alone: made {statistics.median(made):.1f} ms, "
          f"removed {statistics.median(removed):.1f} ms (median)")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
