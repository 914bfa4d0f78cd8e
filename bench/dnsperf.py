"""A ``.internal`` answer as a DNS operator measures it (``python -m bench dnsperf``, root):
``dnsperf`` run inside a machine's network namespace against its worker's name server, side by
side with a floor, on a real cluster (nats-server, a broker, one root agent with
``--private-network on``; sandboxed machines).

* **souq**: ``<app>.internal`` AAAA (an app of 3 started machines) asked at ``[fdaa::3]`` on
  the cluster's names port, the way every machine's ``resolv.conf`` sends it: from the
  machine's namespace, over its veth link, into the worker's ``INPUT`` chain, to the agent's
  server (its UDP thread; the agent's event loop for a question it has no answer kept for).
* **floor**: the same question, the same path, to a minimal responder in a process of its own
  on the worker (a blocking ``recvfrom``/``sendto`` loop; :func:`serve_floor`) that answers
  the very bytes the agent answered (taken from it once with dnspython), its id copied: the
  path and a socket's round trip, nothing of a name server. It listens at ``[fdaa::3]`` on a
  port of its own, let in for the run by one rule at the head of the worker's ``INPUT`` chain.
* **alone**: the agent's DNS server code (:class:`~souq.network.dns_server.DnsServer`) in a
  process of its own, as a daemon runs (uvloop), its index holding the same three machines,
  reached the same way: the server without the rest of the agent beside it in its process.

Two steady loads, **1,000 qps** (``-Q 1000 -q 10``) and **5,000 qps** (``-Q 5000 -q 50``)
(dnsperf's ``-q 1`` sends about 40 queries a second: no closed loop of one), ``DNSPERF_ROUNDS``
rounds of ``DNSPERF_SECONDS`` per arm, the arms alternating (the order reversed every other
round); then both again **scheduled first**: every thread of the three servers' processes and
dnsperf at SCHED_FIFO (``chrt``), so that the box's other work waits behind all of them alike;
last the most each answers (``-q 100``, no limit). Latency is dnsperf's own per query
(``-v``); p50 / p99 / p99.9 over all rounds' queries, and the median of the rounds' p99.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import dns.message
import dns.query

from bench.stats import machine_line, percentile
from souq.natsserver import free_port
from souq.network import links
from souq.network.links import DNS_ADDRESS
from souq.testing import Cluster, wait_until

SECONDS = int(os.environ.get("DNSPERF_SECONDS", "5"))
ROUNDS = int(os.environ.get("DNSPERF_ROUNDS", "6"))
CONFIG = {"guest": {"memory_mb": 64}, "cmd": ["/bin/sleep", "600"]}
RT = "20"  # the SCHED_FIFO priority of the "scheduled first" rounds
LOADS = {"1,000 qps": ["-Q", "1000", "-q", "10"], "5,000 qps": ["-Q", "5000", "-q", "50"]}


def serve_floor(port: int, answer_hex: str) -> None:
    """The floor: ``answer`` (a rendered DNS answer) sent back to every datagram on
    ``[fdaa::3]:port`` with the datagram's id (its first two bytes), nothing parsed."""
    tail = bytes.fromhex(answer_hex)[2:]
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
        sock.bind((DNS_ADDRESS, port))
        print("listening", flush=True)
        recv, send = sock.recvfrom, sock.sendto
        while True:
            data, peer = recv(512)
            send(data[:2] + tail, peer)


def serve_alone(port: int, app: str, addresses: list[str]) -> None:
    """The agent's DNS server (:class:`~souq.network.dns_server.DnsServer`, the same code)
    alone in a process of its own, as a daemon runs (uvloop, the daemons' collector), its index
    holding the app's machines: what the server costs without the rest of the agent."""
    import asyncio

    from souq import daemon
    from souq.network.dns_server import DnsServer, Forwarder
    from souq.network.names import NameIndex, NameRow

    async def main() -> None:
        index = NameIndex()
        for i, ip in enumerate(addresses):
            index.put(NameRow(f"m{i}", app, "mad", "started", True, ip, created_at=str(i)))
        server = DnsServer(index, Forwarder([]), listen=(DNS_ADDRESS, port))
        await server.start()
        print("listening", flush=True)
        await asyncio.Event().wait()

    daemon.run(main())


def _ask(netns: str, port: int, datafile: Path, *options: str, prefix: Sequence[str] = ()) -> str:
    """dnsperf's report, run in ``netns`` against ``[fdaa::3]:port`` for SECONDS."""
    command = ["dnsperf", "-s", DNS_ADDRESS, "-p", str(port), "-d", str(datafile)]
    return subprocess.run(
        ["ip", "netns", "exec", netns, *prefix, *command, "-l", str(SECONDS), *options],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _latencies(
    netns: str, port: int, datafile: Path, load: list[str], prefix: list[str]
) -> list[float]:
    """Each query's latency (s), as dnsperf saw it (run under ``prefix``: chrt)."""
    out = _ask(netns, port, datafile, "-v", *load, prefix=prefix)
    times = []
    for line in out.splitlines():
        parts = line.split()
        # "> NOERROR <name> AAAA <latency>": one answered query
        if len(parts) == 5 and parts[0] == ">":
            if parts[1] != "NOERROR":
                raise RuntimeError(f"dnsperf: {line}")
            times.append(float(parts[4]))
    if not times:
        raise RuntimeError(f"dnsperf answered nothing: {out[-500:]}")
    return times


def _qps(netns: str, port: int, datafile: Path) -> float:
    out = _ask(netns, port, datafile, "-q", "100")
    for line in out.splitlines():
        if "Queries per second:" in line:
            return float(line.split(":")[1])
    raise RuntimeError(f"dnsperf gave no rate: {out[-500:]}")


def _summary(rounds: list[list[float]]) -> dict[str, Any]:
    every = [v * 1e6 for r in rounds for v in r]
    return {
        "queries": len(every),
        "p50_us": round(statistics.median(every), 1),
        "p99_us": round(percentile(every, 99), 1),
        "p99.9_us": round(percentile(every, 99.9), 1),
        "max_us": round(max(every), 1),
        "rounds_p99_us": [round(percentile([v * 1e6 for v in r], 99), 1) for r in rounds],
        "median_round_p99_us": round(
            statistics.median(percentile([v * 1e6 for v in r], 99) for r in rounds), 1
        ),
    }


def _measure(netns: str, ports: dict[str, int], datafile: Path, pids: list[int]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for load_name, load in LOADS.items():
        for first in (False, True):
            with _scheduled_first(pids) if first else contextlib.nullcontext():
                got = _rounds(netns, ports, datafile, ["chrt", "-f", RT] if first else [], load)
            arms: dict[str, Any] = {arm: _summary(rounds) for arm, rounds in got.items()}
            floor = arms["floor"]
            for arm in ("souq", "alone"):
                arms[f"{arm}_p99_ratio"] = round(arms[arm]["p99_us"] / floor["p99_us"], 2)
                arms[f"{arm}_median_round_p99_ratio"] = round(
                    arms[arm]["median_round_p99_us"] / floor["median_round_p99_us"], 2
                )
            results[load_name + (", scheduled first" if first else "")] = arms
    most: dict[str, list[float]] = {arm: [] for arm in ports}
    for i in range(2):
        for arm in list(ports) if i % 2 == 0 else list(ports)[::-1]:
            most[arm].append(_qps(netns, ports[arm], datafile))
    results["most qps"] = {arm: round(max(v)) for arm, v in most.items()}
    return results


def _rounds(
    netns: str, ports: dict[str, int], datafile: Path, prefix: list[str], load: list[str]
) -> dict[str, list[list[float]]]:
    """ROUNDS of each arm, alternating (the order reversed every other round)."""
    got: dict[str, list[list[float]]] = {arm: [] for arm in ports}
    for i in range(ROUNDS):
        for arm in list(ports) if i % 2 == 0 else list(ports)[::-1]:
            got[arm].append(_latencies(netns, ports[arm], datafile, load, prefix))
    return got


@contextlib.contextmanager
def _scheduled_first(pids: list[int]) -> Iterator[None]:
    """Every thread of ``pids`` (the agent, the floor, the server alone) at SCHED_FIFO for the
    block, as dnsperf is then run: the box's other work waits behind all of them alike, so
    what is left of the tail is the path's and the servers' own."""
    for pid in pids:
        subprocess.run(["chrt", "-a", "-f", "-p", RT, str(pid)], check=True)
    try:
        yield
    finally:
        for pid in pids:
            subprocess.run(["chrt", "-a", "-o", "-p", "0", str(pid)], check=False)


def _answer(port: int, name: str) -> bytes:
    """The agent's answer to ``name`` as dnsperf asks it (no EDNS), rendered, as sent."""
    query = dns.message.make_query(name, "AAAA", use_edns=False)
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2)
        sock.sendto(query.to_wire(), (DNS_ADDRESS, port))
        wire, _ = sock.recvfrom(65535)
    got = dns.message.from_wire(wire)
    if len(got.answer[0]) != 3 if got.answer else True:
        raise RuntimeError(f"{name}: {got}")
    return wire


def _run(root: Path) -> dict[str, Any]:
    with Cluster(root, regions={}) as c:
        c.add_agent("mad", machine_user=None, default_driver=None,
                    extra_args=["--private-network", "on"])  # fmt: skip
        c.wait_for_workers()
        client = c.client()
        app = "d" + uuid.uuid4().hex[:8]
        made = [client.create_machine(app, "mad", CONFIG) for _ in range(3)]
        for m in made:
            client.wait(app, m.id, "started", timeout=60)
        name = f"{app}.internal"
        wire = wait_until(
            lambda: _try_answer(c.names_port, name), timeout=15, message="the app's name"
        )
        worker = c.agents[0].worker_id or ""
        net = links.WorkerNetwork(worker, root / "x")
        netns = Path(glob.glob(f"/run/netns/souq-{net.tag}-{made[0].id}")[0]).name
        floor_port = free_port()
        alone_port = free_port()
        addresses = [rd.to_text() for rd in dns.message.from_wire(wire).answer[0]]
        others = [
            _python(f"serve_floor({floor_port}, {wire.hex()!r})"),
            _python(f"serve_alone({alone_port}, {app!r}, {addresses!r})"),
        ]
        rules = [_rule(floor_port), _rule(alone_port)]
        for rule in rules:
            subprocess.run(["ip6tables", "-w", "-I", net.inp, "1", *rule], check=True)
        try:
            for other in others:
                assert other.stdout is not None
                other.stdout.readline()
            datafile = root / "queries.txt"
            datafile.write_text(f"{name} AAAA\n")
            ports = {"souq": c.names_port, "floor": floor_port, "alone": alone_port}
            pids = [c.agents[0].pid, *(other.pid for other in others)]
            return _measure(netns, ports, datafile, pids)
        finally:
            for rule in rules:
                subprocess.run(["ip6tables", "-w", "-D", net.inp, *rule], check=False)
            for other in others:
                other.terminate()
                other.wait()
            for m in made:
                client.destroy(app, m.id, force=True)


def _python(call: str) -> subprocess.Popen[bytes]:
    """``call`` of this module in a process of its own (it prints once it listens)."""
    return subprocess.Popen(
        [sys.executable, "-c", f"from bench.dnsperf import *; {call}"],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def _rule(port: int) -> list[str]:
    """What lets a machine reach ``[fdaa::3]:port`` for the run (the worker's INPUT chain)."""
    return ["-d", f"{DNS_ADDRESS}/128", "-p", "udp", "--dport", str(port), "-j", "ACCEPT"]


def _try_answer(port: int, name: str) -> bytes | None:
    try:
        return _answer(port, name)
    except (OSError, RuntimeError, IndexError):
        return None


def main() -> None:
    why = links.unavailable()
    if why is not None or shutil.which("dnsperf") is None:
        print(f"dnsperf: skipped ({why or 'no dnsperf: apt-get install dnsperf'})")
        return
    print(f"# dnsperf benchmark — {machine_line()}")
    root = Path(tempfile.mkdtemp(prefix="souq-bench-dnsperf-", dir="/var/tmp"))
    root.chmod(0o711)
    try:
        results = _run(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results |= {"seconds": SECONDS, "rounds": ROUNDS}
    print(json.dumps(results, indent=2))
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "dnsperf.json").write_text(json.dumps({"machine": machine_line(), **results}, indent=2))


if __name__ == "__main__":
    main()
