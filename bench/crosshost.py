"""Machine to machine over the private network, across hosts (``python -m bench crosshost``,
root): TCP round trip and throughput between two machines on two hosts (network namespaces,
souq.multihost, agents with ``--private-network on``: the route between them is the VXLAN
device of each host, docs/network.md), and between two machines of one host, against the same
two programs run straight in the two hosts' namespaces over their veth and bridge, without
Souq (the floor), interleaved in one run; and the machines across hosts once more with each
host's fast path (souq.network.fastpath) taken away for the arm, the hosts' routing and chains
alone (``kernel's``). Five times: the agents' underlay the hosts' IPv6
addresses (on one segment: each worker's /48 routed straight to the other host), their IPv4
addresses with ``--underlay-link vxlan`` (over VXLAN), their IPv4 addresses as default agents
run (``link``: ``--underlay-link auto``, on one segment: IPv6 routed straight via the hosts'
link-local addresses once a probe over the link was answered, no VXLAN; the run waits for
that route and says how long it took), the same with ``--underlay-link direct`` (no probe),
and their IPv4 addresses with ``--underlay-encryption wireguard``; the floor talks over the
same addresses.

The programs (:data:`PEER`, one Python file, the host's ``/usr/bin/python3`` on both sides):
a server that echoes one byte per round trip (``l``) or takes a stream to its end and answers
one byte (``t``), and a client that times ``ROUND_TRIPS`` one-byte round trips (TCP_NODELAY,
after a warm-up) and ``STREAM_MB`` MiB sent in 1 MiB writes, ``STREAMS`` times. In a machine the
client runs by ``exec`` and prints its figures; the timing is its own, inside the machine.

Nothing is pinned unless ``SOUQ_BENCH_CPU`` says on which CPU: on a box shared with other work a
pinned process waits for its CPU (a round trip of 75 µs instead of 11-20), and on an idle one the
wake-ups across CPUs are what is slow (120 µs on loopback, 12 pinned). Round trips come in two modes
(the two processes on one CPU or on two: about 10.5 against 15.5 µs for the floor here), so there
are many short rounds and the table gives the median of their medians and the best round. CPU per
operation beside the rates: the whole box's busy CPU time (``/proc/stat``, which no namespace
narrows: the forwarding, VXLAN and filter work is the kernel's, in no process) over the client's
timed loop, divided by its round trips or MiB; on a shared box it holds the neighbours' work too, so
the floor's figure, measured alongside, is the yardstick."""

from __future__ import annotations

import contextlib
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
from souq.netns import NetHost, missing, netns_exec
from souq.network import links, wireguard
from souq.network.mesh import worker_prefix
from souq.testing import wait_until

PYTHON = "/usr/bin/python3"
PORT = 7001
ROUND_TRIPS = int(os.environ.get("SOUQ_BENCH_ROUND_TRIPS", "10000"))
STREAM_MB = int(os.environ.get("SOUQ_BENCH_STREAM_MB", "256"))
STREAMS = 3
ROUNDS = int(os.environ.get("SOUQ_BENCH_ROUNDS", "11"))
# SOUQ_BENCH_CPU=N: every server and client on CPU N alone (the round trip's whole work on one
# CPU, none of the wake-ups across CPUs that an idle VM makes slow: 120 µs a round trip on
# loopback here, against 12 pinned); default: nothing pinned.
CPU = os.environ.get("SOUQ_BENCH_CPU", "")
PINNED = ["/usr/bin/env", f"PIN={CPU}"] if CPU else []
KERNEL = "kernel's"  # across, the fast path taken away: the hosts' routing and chains
ARMS = ("floor", "across", KERNEL, "one host")

PEER = r"""
import json, os, socket, struct, sys, time
def busy():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:8]]
    return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")
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
    cpu = 0.0
    if phase == "rtt":
        c = socket.create_connection((host, port))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.sendall(b"l")
        for _ in range(1000): c.sendall(b"p"); c.recv(1)
        times = []
        cpu -= busy()
        for _ in range(count):
            t = time.perf_counter_ns(); c.sendall(b"p"); c.recv(1)
            times.append(time.perf_counter_ns() - t)
        cpu += busy()
        c.close()
        times.sort()
        out["rtt_us"] = [times[len(times) // 2] / 1000, times[int(len(times) * 0.99)] / 1000]
    else:
        size = count << 20; chunk = b"x" * (1 << 20); rates = []
        for _ in range(streams):
            c = socket.create_connection((host, port))
            t = time.perf_counter(); cpu -= busy()
            c.sendall(b"t" + struct.pack("!Q", size))
            for _ in range(count): c.sendall(chunk)
            c.recv(1); cpu += busy(); rates.append(size * 8 / (time.perf_counter() - t) / 1e9)
            c.close()
        out["gbit_s"] = sorted(rates)[len(rates) // 2]
    out["cpu_s"] = cpu
    print(json.dumps(out), flush=True)
if os.environ.get("PIN"): os.sched_setaffinity(0, {int(os.environ["PIN"])})
if sys.argv[1] == "serve": serve(int(sys.argv[2]))
else: client(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
"""


Runner = Callable[[list[str]], str]  # the client's argv -> its output


def _measured(run: Runner, server: str) -> dict[str, Any]:
    """Both phases, each with the box's CPU over its timed part (read by the client)."""
    got: dict[str, Any] = {}
    for phase, count in (("rtt", ROUND_TRIPS), ("stream", STREAM_MB)):
        argv = [*PINNED, PYTHON, "-c", PEER, "client", server, str(PORT), phase, str(count)]
        argv.append(str(STREAMS))
        out = json.loads(run(argv).strip().splitlines()[-1])
        got[f"cpu_{phase}_s"] = out.pop("cpu_s")
        got.update(out)
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


class _KernelPath:
    """For the arm "across, kernel's path": each host's fast path table (its listing kept)
    taken away while it runs, then put back as it was (souq.network.fastpath)."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self.saved: dict[str, str] = {}

    def __enter__(self) -> None:
        for host in self.hosts.hosts:
            table = ("netdev", f"souq-{links.WorkerNetwork(host.worker_id, Path('/')).tag}")
            shown = host.net.exec("nft", "list", "table", *table, check=False)
            if "table netdev" in shown:
                self.saved[host.name] = shown
                host.net.exec("nft", "delete", "table", *table)

    def __exit__(self, *_: object) -> None:
        for name, shown in self.saved.items():
            subprocess.run([*netns_exec(name), "nft", "-f", "-"], input=shown, text=True,
                           check=True)  # fmt: skip
        self.saved = {}


def _machine(api: SouqClient, app: str, region: str, cmd: list[str]) -> Machine:
    m = api.create_machine(app, region, {"guest": {"cpus": 1, "memory_mb": 256}, "cmd": cmd})
    return api.wait(app, m.id, MachineState.STARTED, timeout=60)


def _over_link(host: Host, other: Host) -> bool:
    """Whether ``host`` routes ``other``'s /48 via its link-local address on ``eth0``."""
    local = other.net.exec("ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link")
    route = host.net.exec("ip", "-6", "route", "show", str(worker_prefix(other.worker_id)))
    return f"via {local.split()[3].split('/')[0]} dev eth0" in route


def _run(
    hosts: Hosts,
    address: Callable[[NetHost], str],
    *,
    straight_over_link: bool = False,
    since: float = 0.0,
) -> dict[str, list[dict[str, Any]]]:
    """The arms, interleaved; the floor's client reaches the server at ``address`` of its host
    (the underlay the agents route over); ``straight_over_link``: first until both route
    straight via the other's link-local (``since``: when the hosts started)."""
    mad, syd = hosts.hosts
    api = SouqClient(hosts.api_url, token=hosts.auth.admin() if hosts.auth else None)
    app = "xb" + uuid.uuid4().hex[:8]
    api.create_app(app)
    server = _machine(api, app, "syd", [*PINNED, PYTHON, "-c", PEER, "serve", str(PORT)])
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
    if straight_over_link:  # the default agents' way: only once their probes are answered
        wait_until(
            lambda: _over_link(mad, syd) and _over_link(syd, mad),
            timeout=60,
            message="both routed straight over the link",
        )
        print(f"  routed straight over the link {time.monotonic() - since:.1f} s after the "
              "hosts started", file=sys.stderr)  # fmt: skip
    floor_server = subprocess.Popen(
        [*netns_exec(syd.name), *PINNED, PYTHON, "-c", PEER, "serve", str(PORT)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in ARMS}
    try:
        assert floor_server.stdout is not None and floor_server.stdout.readline()
        for i in range(ROUNDS):
            arms = [
                ("floor", _on_host(mad), address(syd.net)),
                ("across", _in_machine(api, app, far), server.private_ip),
                (KERNEL, _in_machine(api, app, far), server.private_ip),
                ("one host", _in_machine(api, app, near), server.private_ip),
            ]
            for name, run, to in arms if i % 2 == 0 else arms[::-1]:
                with _KernelPath(hosts) if name == KERNEL else contextlib.nullcontext():
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
        "best_us": min(r["rtt_us"][0] for r in runs),
        "p99_us": p99,
        "gbit_s": rate,
        "cpu_us_per_rtt": statistics.median(r["cpu_rtt_s"] for r in runs) / ROUND_TRIPS * 1e6,
        "cpu_ms_per_mib": statistics.median(r["cpu_stream_s"] for r in runs)
        / (STREAM_MB * STREAMS)
        * 1e3,
    }


# key, title, the agents' --underlay, --underlay-encryption, --underlay-link ("": the default)
UNDERLAYS: list[tuple[str, str, Callable[[NetHost], str], str, str]] = [
    ("straight", "IPv6 on the hosts' segment: routed straight", lambda net: net.address6, "none",
     ""),
    ("vxlan", "IPv4, --underlay-link vxlan: over VXLAN", lambda net: net.address, "none",
     "vxlan"),
    ("link", "IPv4 on the hosts' segment, default agents (--underlay-link auto): IPv6 via "
     "link-locals once probed", lambda net: net.address, "none", ""),
    ("direct", "IPv4 on the hosts' segment, --underlay-link direct: IPv6 via link-locals",
     lambda net: net.address, "none", "direct"),
    ("wireguard", "IPv4: WireGuard", lambda net: net.address, "wireguard", ""),
]  # fmt: skip
# Which of them (SOUQ_BENCH_UNDERLAYS=straight,vxlan: those two alone); default: all.
CHOSEN = os.environ.get("SOUQ_BENCH_UNDERLAYS", "straight,vxlan,link,direct,wireguard").split(",")


def main() -> None:
    why = missing() or links.unavailable() or sandbox.unavailable()
    if why is not None:
        print(f"crosshost: skipped ({why})")
        return
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"crosshost: {machine_line()}; {ROUNDS} rounds interleaved, medians; {started}")
    print(f"  {ROUND_TRIPS} one-byte TCP round trips, {STREAMS} x {STREAM_MB} MiB streams each")
    for key, title, address, encryption, link in UNDERLAYS:
        if key not in CHOSEN:
            continue
        if encryption == "wireguard" and wireguard.unavailable() is not None:
            print(f"  underlay {title}: skipped ({wireguard.unavailable()})")
            continue
        since = time.monotonic()
        with (
            machines_root("souq-bench-xhost-") as root,
            Hosts(
                root / "hosts",
                ["mad", "syd"],
                private_network=True,
                underlay=address,
                underlay_encryption=encryption,
                underlay_link=link,
            ) as hosts,
        ):
            over_link = key == "link"  # IPv4 on one segment, the default: straight once probed
            results = _run(hosts, address, straight_over_link=over_link, since=since)
        floor = _summary(results["floor"])
        print(f"  underlay {title}")
        print(
            f"    {'':10} {'rtt µs':>8} {'x floor':>8} {'best µs':>8} {'x floor':>8}"
            f" {'p99 µs':>8} {'Gbit/s':>8}"
            f" {'x floor':>8} {'CPU µs/rtt':>11} {'CPU ms/MiB':>11}"
        )
        for name in ARMS:
            s = _summary(results[name])
            print(
                f"    {name:10} {s['rtt_us']:8.1f} {s['rtt_us'] / floor['rtt_us']:8.2f}"
                f" {s['best_us']:8.1f} {s['best_us'] / floor['best_us']:8.2f} {s['p99_us']:8.1f}"
                f" {s['gbit_s']:8.2f} {s['gbit_s'] / floor['gbit_s']:8.2f}"
                f" {s['cpu_us_per_rtt']:11.1f} {s['cpu_ms_per_mib']:11.2f}"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
