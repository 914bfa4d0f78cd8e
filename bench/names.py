"""The ``.internal`` names: how fast a worker answers, and how soon a new machine is a name.

Suite ``names`` (``python -m bench names``), on a real cluster (nats-server, a broker, one
``souq agent`` answering DNS with ``--dns`` on loopback), all on this machine:

* **answer**: ``<app>.internal`` AAAA (an app of 3 started machines), asked ``NAMES_QUERIES``
  times in a row by dnspython (``dns.query.udp``, one socket), timed per round trip. Beside it,
  in the same run, the floor: the same dnspython round trip to a trivial responder in a process
  of its own (tests/dns_upstream.py: dnspython's parse and render, a fixed answer, uvloop as
  the agent has). Target: p99 ≤ 1 ms.
* **forwarded**: a name outside ``.internal`` through the agent to that responder (the agent's
  forwarding on top of the floor's round trip).
* **new machine resolvable**: a machine of a new app is created; ``<app>.internal`` is asked
  every half millisecond until it answers the machine's address. Timed from the ``started``
  event's timestamp (the worker's clock: this host's) to the first answer. Target: ≤ 100 ms.
* **stopped machine gone**: the same machine stopped; timed from its ``stop`` event to the
  first answer without it.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import dns.rcode

from bench.stats import machine_line, summary_ms
from souq.model import Machine, MachineState
from souq.natsserver import free_port
from souq.network.name_feed import private_address
from souq.testing import Cluster, wait_until

REGION = "mad"
QUERIES = int(os.environ.get("NAMES_QUERIES", "5000"))
ROUNDS = int(os.environ.get("NAMES_ROUNDS", "20"))
CONFIG = {"cmd": ["sleep", "600"], "services": [{"internal_port": 8080}]}
UPSTREAM = str(Path(__file__).resolve().parents[1] / "tests" / "dns_upstream.py")


def round_trips(
    sock: socket.socket, where: tuple[str, int], name: str, rdtype: str, n: int
) -> list[float]:
    """Seconds per dnspython UDP round trip, ``n`` of them (after a warm-up)."""
    query = dns.message.make_query(name, rdtype)
    times: list[float] = []
    for i in range(n + 200):
        query.id = random.randrange(65536)
        t0 = time.perf_counter()
        got = dns.query.udp(query, where[0], port=where[1], timeout=2, sock=sock)
        elapsed = time.perf_counter() - t0
        if got.rcode() != dns.rcode.NOERROR or not got.answer:
            raise RuntimeError(f"{name}: {got}")
        if i >= 200:
            times.append(elapsed)
    return times


def addresses(where: tuple[str, int], name: str, sock: socket.socket) -> set[str]:
    query = dns.message.make_query(name, "AAAA")
    got = dns.query.udp(query, where[0], port=where[1], timeout=2, sock=sock)
    return {rd.to_text() for rrset in got.answer for rd in rrset}


def event_ms(machine: Machine, status: MachineState) -> int:
    return next(e.timestamp for e in machine.events if e.status == status)


def resolvable(cluster: Cluster, where: tuple[str, int], sock: socket.socket) -> dict[str, Any]:
    client = cluster.client()
    start_ms: list[float] = []
    stop_ms: list[float] = []
    for _ in range(ROUNDS):
        app = "r" + uuid.uuid4().hex[:8]
        created = client.create_machine(app, REGION, CONFIG)
        name = f"{app}.internal"
        while not addresses(where, name, sock):
            time.sleep(0.0005)
        seen_ms = time.time() * 1000
        machine = client.wait(app, created.id, "started")
        start_ms.append(seen_ms - event_ms(machine, MachineState.STARTED))
        stopping = client.stop(app, created.id)
        while addresses(where, name, sock):
            time.sleep(0.0005)
        gone_ms = time.time() * 1000
        stop_ms.append(gone_ms - event_ms(stopping, MachineState.STOPPING))
        client.wait(app, created.id, "stopped")
        client.destroy(app, created.id)
    return {
        "started_to_resolvable_ms": summary_ms([v / 1000 for v in start_ms]),
        "stop_to_gone_ms": summary_ms([v / 1000 for v in stop_ms]),
    }


def main() -> None:
    print(f"# names benchmark — {machine_line()}")
    listen = ("127.0.0.1", free_port())
    floor_port = free_port()
    floor = subprocess.Popen(
        [sys.executable, UPSTREAM, str(floor_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert floor.stdout is not None
        floor.stdout.readline()  # it listens
        results: dict[str, Any] = {}
        with (
            tempfile.TemporaryDirectory(prefix="souq-bench-") as tmp,
            Cluster(Path(tmp) / "c", regions={}, cpus=4) as cluster,
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock,
        ):
            cluster.add_agent(
                REGION,
                extra_args=[
                    "--advertise",
                    "fdaa:0:0:1::1",
                    "--dns",
                    f"{listen[0]}:{listen[1]}",
                    "--dns-upstream",
                    f"127.0.0.1:{floor_port}",
                ],
            )
            cluster.wait_for_workers()
            client = cluster.client()
            app = "b" + uuid.uuid4().hex[:8]
            machines = [client.create_machine(app, REGION, CONFIG) for _ in range(3)]
            want = {private_address(client.wait(app, m.id, "started").private_ip) for m in machines}
            wait_until(
                lambda: addresses(listen, f"{app}.internal", sock) == want,
                timeout=15,
                message="the app's name",
            )
            results["answer_ms"] = summary_ms(
                round_trips(sock, listen, f"{app}.internal", "AAAA", QUERIES)
            )
            results["floor_ms"] = summary_ms(
                round_trips(sock, ("127.0.0.1", floor_port), "example.test", "A", QUERIES)
            )
            results["forwarded_ms"] = summary_ms(
                round_trips(sock, listen, "example.test", "A", QUERIES // 5)
            )
            results |= resolvable(cluster, listen, sock)
    finally:
        floor.terminate()
        floor.wait()
    results["queries"] = QUERIES
    results["rounds"] = ROUNDS
    print(json.dumps(results, indent=2))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "names.json").write_text(json.dumps({"machine": machine_line(), **results}, indent=2))


if __name__ == "__main__":
    main()
