"""A delay line between network namespaces: latency and loss without ``tc netem``.

Where the kernel has no netem (a minimal VM kernel: ``tc qdisc add ... netem`` says "Specified
qdisc kind is unknown"), this process plays its part. It opens one TUN device per host, moves
each into its host's namespace, and routes there the addresses of the hosts it shapes towards
through it. Every IP packet a host sends to such an address is read here, held for the path's
delay, dropped with the path's loss probability, and written into the destination host's TUN
device, whose kernel takes it as if it had come off the wire. Closing the devices (the process
exits) removes their routes: traffic goes back to the hosts' direct link.

Run as ``python -m souq.delayline SPEC`` with ``SPEC`` a JSON object::

    {"devices": [{"host": 0, "name": "sq1t0", "namespace": "sq1h0", "address": "10.2.3.10"}, ...],
     "paths": [[from_host, to_host, delay_ms, loss_percent], ...], "seed": 1}

It prints ``ready`` on stdout once every route is in place, and runs until SIGTERM.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import json
import os
import random
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Path", "main"]

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


@dataclass(frozen=True)
class Path:
    """What a packet from one host to another goes through."""

    delay_s: float
    loss: float  # a probability, 0..1


def _open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def run(spec: dict[str, Any]) -> None:
    devices = spec["devices"]
    by_host = {d["host"]: d for d in devices}
    host_of = {socket.inet_aton(d["address"]): d["host"] for d in devices}
    paths = {(a, b): Path(ms / 1000, pct / 100) for a, b, ms, pct in spec["paths"]}
    rng = random.Random(spec.get("seed", 0))
    fds: dict[int, int] = {}
    for d in devices:
        fds[d["host"]] = fd = _open_tun(d["name"])
        ns, name = d["namespace"], d["name"]
        _ip("link", "set", name, "netns", ns)
        _ip("-n", ns, "link", "set", name, "up")
    for a, b in paths:
        source, target = by_host[a], by_host[b]
        _ip("-n", source["namespace"], "route", "replace", f"{target['address']}/32",
            "dev", source["name"])  # fmt: skip
    host_by_fd = {fd: host for host, fd in fds.items()}
    selector = selectors.DefaultSelector()
    for fd in fds.values():
        selector.register(fd, selectors.EVENT_READ)
    due: list[tuple[float, int, int, bytes]] = []  # (when, order, to host, packet)
    order = 0
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    parent = os.getppid()
    print("ready", flush=True)
    while not stop and os.getppid() == parent:  # an orphan (its owner died) stops
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, to, packet = heapq.heappop(due)
            with contextlib.suppress(OSError):  # a full queue: lost, as on a wire
                os.write(fds[to], packet)
        timeout = max(0.0, due[0][0] - now) if due else 0.5
        for key, _ in selector.select(timeout):
            fd = int(key.fd)
            while True:
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if len(packet) < 20 or packet[0] >> 4 != 4:
                    continue  # IPv4 only
                src = host_by_fd[fd]
                dst = host_of.get(packet[16:20])
                path = paths.get((src, dst)) if dst is not None else None
                if path is None or dst is None or (path.loss and rng.random() < path.loss):
                    continue
                order += 1
                heapq.heappush(due, (time.monotonic() + path.delay_s, order, dst, packet))
    for fd in fds.values():
        os.close(fd)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    run(json.loads(args[0]))


if __name__ == "__main__":
    main()
