"""Machine to machine over the private network, across hosts (``python -m bench crosshost``,
root): TCP round trip and throughput between two machines on two hosts (network namespaces,
souq.multihost, agents with ``--private-network on``: the route between them is the VXLAN
device of each host, docs/network.md), and between two machines of one host, against the same
two programs run straight in the two hosts' namespaces over their veth and bridge, without
Souq (the floor), interleaved in one run.

The programs (:data:`PEER`, one Python file, the host's ``/usr/bin/python3`` on both sides):
a server that echoes one byte per round trip (``l``) or takes a stream to its end and answers
one byte (``t``), and a client that times ``ROUND_TRIPS`` one-byte round trips (TCP_NODELAY,
after a warm-up) and ``STREAM_MB`` MiB sent in 1 MiB writes, ``STREAMS`` times. In a machine the
client runs by ``exec`` and prints its figures; the timing is its own, inside the machine.

CPU per operation beside the rates: the whole box's busy CPU time (``/proc/stat``: the
forwarding, VXLAN and filter work is the kernel's, in no process) over each phase, divided by
the round trips or the MiB; on a shared box it holds the neighbours' work too, so the floor's
figure, measured alongside, is the yardstick.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.isolated import machines_root

from bench.stats import machine_line
from souq.client.api import SouqClient
from souq.drivers import sandbox
from souq.model.machine import Machine, MachineState
from souq.multihost import Host, Hosts
from souq.netns import missing, netns_exec
from souq.network import links
from souq.network.mesh import worker_prefix
from souq.testing import wait_until

PYTHON = "/usr/bin/python3"
PORT = 7001
ROUND_TRIPS = int(os.environ.get("SOUQ_BENCH_ROUND_TRIPS", "20000"))
STREAM_MB = int(os.environ.get("SOUQ_BENCH_STREAM_MB", "512"))
STREAMS = 3
ROUNDS = int(os.environ.get("SOUQ_BENCH_ROUNDS", "3"))

PEER = r"""
import json, socket, struct, sys, time
def serve(port):
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", port)); s.listen()
    print("listening", flush=True)
    while True:
        c, _ = s.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        mode = c.recv(1)
        if mode == b"l":
            while (b := c.recv(1)):
                c.sendall(b)
        elif mode == b"t":
            (left,) = struct.unpack("!Q", c.recv(8, socket.MSG_WAITALL))
            buf = bytearray(1 << 20)
            while left > 0:
                n = c.recv_into(buf, min(left, len(buf)))
                if not n: break
                left -= n
            c.sendall(b"k")
        c.close()
def client(host, port, phase, count, streams):
    out = {}
    if phase == "rtt":
        c = socket.create_connection((host, port))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.sendall(b"l")
        for _ in range(1000): c.sendall(b"p"); c.recv(1)
        times = []
        for _ in range(count):
            t = time.perf_counter_ns(); c.sendall(b"p"); c.recv(1)
            times.append(time.perf_counter_ns() - t)
        c.close()
        times.sort()
        out["rtt_us"] = [times[len(times) // 2] / 1000, times[int(len(times) * 0.99)] / 1000]
    else:
        size = count << 20; chunk = b"x" * (1 << 20); rates = []
        for _ in range(streams):
            c = socket.create_connection((host, port))
            t = time.perf_counter()
            c.sendall(b"t" + struct.pack("!Q", size))
            for _ in range(count): c.sendall(chunk)
            c.recv(1); rates.append(size * 8 / (time.perf_counter() - t) / 1e9); c.close()
        out["gbit_s"] = sorted(rates)[len(rates) // 2]
    print(json.dumps(out), flush=True)
if sys.argv[1] == "serve": serve(int(sys.argv[2]))
else: client(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
"""


def _busy_s() -> float:
    """The box's busy CPU seconds so far (every CPU: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    ticks = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - fields[3] - fields[4]) / ticks


Runner = Callable[[list[str]], str]  # the client's argv -> its output


def _measured(run: Runner, server: str) -> dict[str, Any]:
    """Both phases, each with the box's CPU over it."""
    got: dict[str, Any] = {}
    for phase, count, cpu in (
        ("rtt", ROUND_TRIPS, "cpu_rtt_s"),
        ("stream", STREAM_MB, "cpu_stream_s"),
    ):
        argv = [PYTHON, "-c", PEER, "client", server, str(PORT), phase, str(count), str(STREAMS)]
        before = _busy_s()
        out = run(argv)
        got[cpu] = _busy_s() - before
        got.update(json.loads(out.strip().splitlines()[-1]))
    return got


def _on_host(host: Host) -> Runner:
    def run(argv: list[str]) -> str:
        done = subprocess.run(
            [*netns_exec(host.name), *argv], capture_output=True, text=True, check=True,
            timeout=600,
        )  # fmt: skip
        return done.stdout

    return run


def _in_machine(api: SouqClient, app: str, m: Machine) -> Runner:
    def run(argv: list[str]) -> str:
        return api.exec(app, m.id, argv, stdin=None, timeout_s=300).stdout

    return run


def _machine(api: SouqClient, app: str, region: str, cmd: list[str]) -> Machine:
    m = api.create_machine(app, region, {"guest": {"cpus": 1, "memory_mb": 256}, "cmd": cmd})
    return api.wait(app, m.id, MachineState.STARTED, timeout=60)


def _run(hosts: Hosts) -> dict[str, list[dict[str, Any]]]:
    mad, syd = hosts.hosts
    api = SouqClient(hosts.api_url, token=hosts.auth.admin() if hosts.auth else None)
    app = "xb" + uuid.uuid4().hex[:8]
    api.create_app(app)
    server = _machine(api, app, "syd", [PYTHON, "-c", PEER, "serve", str(PORT)])
    wait_until(lambda: "listening" in api.logs(app, server.id), timeout=30, message="listen")
    far = _machine(api, app, "mad", ["sleep", "3600"])
    near = _machine(api, app, "syd", ["sleep", "3600"])
    assert server.private_ip and far.worker_id == mad.worker_id
    assert near.worker_id == syd.worker_id
    wait_until(
        lambda: str(worker_prefix(syd.worker_id)) in mad.net.exec("ip", "-6", "route"),
        timeout=30,
        message="the route to syd's machines",
    )
    floor_server = subprocess.Popen(
        [*netns_exec(syd.name), PYTHON, "-c", PEER, "serve", str(PORT)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    results: dict[str, list[dict[str, Any]]] = {"floor": [], "across": [], "one host": []}
    try:
        assert floor_server.stdout is not None and floor_server.stdout.readline()
        for i in range(ROUNDS):
            arms = [
                ("floor", _on_host(mad), syd.net.address),
                ("across", _in_machine(api, app, far), server.private_ip),
                ("one host", _in_machine(api, app, near), server.private_ip),
            ]
            for name, run, to in arms if i % 2 == 0 else arms[::-1]:
                results[name].append(_measured(run, to))
                print(f"  round {i + 1} {name}: {results[name][-1]}", file=sys.stderr)
    finally:
        floor_server.kill()
        floor_server.wait()
        for m in (server, far, near):
            api.destroy(app, m.id, force=True)
        api.close()
    return results


def _summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    rtt = statistics.median(r["rtt_us"][0] for r in runs)
    p99 = statistics.median(r["rtt_us"][1] for r in runs)
    rate = statistics.median(r["gbit_s"] for r in runs)
    return {
        "rtt_us": rtt,
        "p99_us": p99,
        "gbit_s": rate,
        "cpu_us_per_rtt": statistics.median(r["cpu_rtt_s"] for r in runs) / ROUND_TRIPS * 1e6,
        "cpu_ms_per_mib": statistics.median(r["cpu_stream_s"] for r in runs)
        / (STREAM_MB * STREAMS)
        * 1e3,
    }


def main() -> None:
    why = missing() or links.unavailable() or sandbox.unavailable()
    if why is not None:
        print(f"crosshost: skipped ({why})")
        return
    with (
        machines_root("souq-bench-xhost-") as root,
        Hosts(root / "hosts", ["mad", "syd"], private_network=True) as hosts,
    ):
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        results = _run(hosts)
    floor = _summary(results["floor"])
    print(f"crosshost: {machine_line()}, {started}; {ROUNDS} rounds interleaved, medians")
    print(f"  {ROUND_TRIPS} one-byte TCP round trips, {STREAMS} x {STREAM_MB} MiB streams each")
    print(
        f"  {'':10} {'rtt µs':>8} {'p99 µs':>8} {'x floor':>8} {'Gbit/s':>8} {'x floor':>8}"
        f" {'CPU µs/rtt':>11} {'CPU ms/MiB':>11}"
    )
    for name in ("floor", "across", "one host"):
        s = _summary(results[name])
        print(
            f"  {name:10} {s['rtt_us']:8.1f} {s['p99_us']:8.1f}"
            f" {s['rtt_us'] / floor['rtt_us']:8.2f}"
            f" {s['gbit_s']:8.2f} {s['gbit_s'] / floor['gbit_s']:8.2f}"
            f" {s['cpu_us_per_rtt']:11.1f} {s['cpu_ms_per_mib']:11.2f}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
