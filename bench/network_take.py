"""Where a machine's network goes at its start (``python -m bench network_take``, root): each
process :meth:`WorkerNetwork.ensure` runs, timed apart, and the same namespace made in two
parts, as a sandbox made ahead with its own network would make it: *ahead* (what depends on no
machine: the namespace, the veth pair under a spare name, ``lo`` up, ``route_localnet``) and
*take* (what does: the link's name, addresses and routes on both sides, the DNAT to loopback
inside, the worker's firewall rules and the fast path's entry). Medians over the rounds (a
namespace's removal: not shown)."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import private_network
from souq.network import fastpath, links
from souq.network.addresses import GATEWAY4, GATEWAY6, AddressPool, PrivateAddress

ROUNDS = int(os.environ.get("SOUQ_BENCH_ROUNDS", "20"))


def _label(args: list[str], stdin: str | None) -> str:
    """A process of ensure's, named by what it does."""
    if args[1:3] in (["netns", "delete"], ["link", "delete"]) or "-D " in (stdin or ""):
        return "removal"
    if args[:2] == ["ip", "-batch"]:
        return "ip -batch (the worker's side)"
    if args[:2] == ["ip", "-n"]:
        return "ip -n NS -batch (the machine's side)"
    if "sysctl" in args:
        return "ip netns exec NS sysctl route_localnet"
    if args[:3] == ["ip", "netns", "exec"]:
        return "ip netns exec NS iptables-restore (DNAT to loopback)"
    tables = " ".join(line for line in (stdin or "").splitlines() if line.startswith("*"))
    return f"{args[0]} {tables} (the worker's rules)"


def _timed(calls: dict[str, list[float]], run: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(args: list[str], stdin: str | None = None, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return run(args, stdin, **kw)
        finally:
            calls[_label(args, stdin)].append((time.perf_counter() - start) * 1000)

    return wrapper


def _ensure_parts(net: links.WorkerNetwork, rounds: int) -> None:
    calls: dict[str, list[float]] = defaultdict(list)
    run, nft = links._run, fastpath._nft
    links._run = _timed(calls, run)  # type: ignore[assignment]

    def timed_nft(script: str) -> None:
        start = time.perf_counter()
        try:
            nft(script)
        finally:
            what = "removal" if script.startswith("delete") else "the fast path's entry"
            calls[f"nft -f - ({what})"].append((time.perf_counter() - start) * 1000)

    fastpath._nft = timed_nft  # type: ignore[assignment]
    try:
        made, _ = private_network._alone(rounds, net)
    finally:
        links._run, fastpath._nft = run, nft  # type: ignore[assignment]
    per = {  # what runs once a namespace, not the worker's start and stop around them
        k: statistics.median(v) for k, v in calls.items() if "removal" not in k and len(v) >= rounds
    }
    print(f"WorkerNetwork.ensure, {rounds} rounds: {statistics.median(made):.1f} ms (median)")
    for label, ms in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {ms:6.1f} ms x{len(calls[label]) // rounds}  {label}")
    print(f"  {sum(per[k] * (len(calls[k]) // rounds) for k in per):6.1f} ms  the sum")


def _split(net: links.WorkerNetwork, pool: AddressPool, rounds: int) -> None:
    """The namespace made ahead, then given a machine's address, as a slot's would be."""
    ahead_ms, take_ms, steps = [], [], defaultdict(list)
    for i in range(rounds):
        address = pool.take(f"s{i}", "bench")
        names = net.names(f"s{i}", address)
        spare = f"sx{net.tag}w{i:03x}"
        start = time.perf_counter()
        links._run(["ip", "-batch", "-"], f"netns add {names.netns}\n"
                   f"link add {spare} type veth peer name eth0 netns {names.netns}\n"
                   f"link set {spare} addrgenmode none\n")  # fmt: skip
        links._run(["ip", "-n", names.netns, "-batch", "-"],
                   "link set lo up\nlink set eth0 addrgenmode none\n")  # fmt: skip
        links._run(["ip", "netns", "exec", names.netns, "sysctl", "-qw",
                    "net.ipv4.conf.eth0.route_localnet=1"])  # fmt: skip
        ahead_ms.append((time.perf_counter() - start) * 1000)
        try:
            take_ms.append(_take(net, f"s{i}", address, spare, steps))
        finally:
            net.remove(f"s{i}", address)
            links._run(["ip", "link", "delete", spare], check=False)
            pool.give_back(f"s{i}")
    print(f"made ahead: {statistics.median(ahead_ms):.1f} ms; at the take: "
          f"{statistics.median(take_ms):.1f} ms (median)")  # fmt: skip
    for label, ms in steps.items():
        print(f"  {statistics.median(ms):6.1f} ms  {label}")


def _take(
    net: links.WorkerNetwork,
    mid: str,
    a: PrivateAddress,
    spare: str,
    steps: dict[str, list[float]],
) -> float:
    names = net.names(mid, a)
    link = names.link
    marks = [time.perf_counter()]

    def step(label: str) -> None:
        marks.append(time.perf_counter())
        steps[label].append((marks[-1] - marks[-2]) * 1000)

    links._run(["ip", "-batch", "-"], f"link set {spare} name {link}\n"
               f"addr add {GATEWAY6}/64 dev {link} nodad\naddr add {GATEWAY4}/32 dev {link}\n"
               f"link set {link} up\nroute add {a.ip6}/128 dev {link}\n"
               f"route add {a.ip4}/32 dev {link}\n")  # fmt: skip
    step("ip -batch: the link renamed, its gateways, up, the routes to the machine")
    links._run(["ip", "-n", names.netns, "-batch", "-"],
               f"addr add {a.ip6}/128 dev eth0 nodad\naddr add {a.ip4}/32 dev eth0\n"
               f"link set eth0 up\nroute add default via {GATEWAY6} dev eth0\n"
               f"route add {GATEWAY4}/32 dev eth0 scope link\n"
               f"route add default via {GATEWAY4} dev eth0\n")  # fmt: skip
    step("ip -n NS -batch: the machine's addresses and routes")
    rule = f"-A PREROUTING -i eth0 -d {a.ip4}/32 -p tcp -j DNAT --to-destination 127.0.0.1"
    links._run(["ip", "netns", "exec", names.netns, "iptables-restore", "-w"],
               f"*nat\n{rule}\nCOMMIT\n")  # fmt: skip
    step("ip netns exec NS iptables-restore: the DNAT to loopback")
    net._machine_rules(mid, a, "-I")
    step("the worker's rules (ip6tables-restore, iptables-restore)")
    net.fast.add(net.fast_link(mid, a))
    step("nft: the fast path's entry")
    return (marks[-1] - marks[0]) * 1000


def main() -> None:
    why = links.unavailable()
    if why is not None:
        print(f"network take: skipped ({why})")
        return
    worker = "bench-" + uuid.uuid4().hex[:6]
    net = links.WorkerNetwork(worker, Path(tempfile.mkdtemp()))
    pool = AddressPool(worker)
    net.start([])
    try:
        _split(net, pool, ROUNDS)
        _ensure_parts(net, ROUNDS)  # its chains removed after
    finally:
        net.stop_rules()
        net.fast.stop()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")


if __name__ == "__main__":
    main()
