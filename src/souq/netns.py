"""Hosts on one machine: network namespaces on a bridge, and the faults a network has.

:class:`Network` makes a bridge in the root namespace and one namespace per host, each joined
to the bridge by a veth pair and given an address of its own (``eth0`` inside). The root
namespace keeps an address on the bridge too, so that a test or a benchmark reaches every host.
Each host has an IPv6 address on the bridge as well (``address6``, a ULA /64 of the run's), as
hosts on one segment do: the private network routes machines' addresses over it.
Faults, all undone by :meth:`Network.stop` (deleting a namespace takes its rules and queues
with it):

* :meth:`Network.partition` — iptables and ip6tables in the host's namespace drop whatever
  crosses its
  ``eth0`` (its loopback and its own address keep working: a host cut off, not a host down);
  :meth:`Network.heal` removes those rules;
* :meth:`Network.shape` — delay and loss on what a host sends to some others, carried out by a
  delay line (:mod:`souq.delayline`: TUN devices in the hosts' namespaces and a process between
  them), not ``tc netem``, which minimal kernels lack; :meth:`Network.delay` and
  :meth:`Network.loss` apply it both ways between two groups of hosts (to IPv4: the delay
  line carries the hosts' IPv4 addresses only).

Names start with ``sq<pid>`` (the pid of the process that made them), so several runs can live
side by side and :func:`sweep` removes what a crashed run left behind: namespaces and links whose
pid is no longer alive, the processes still running in those namespaces included.
Everything here needs root, ``ip`` and ``iptables``, and ``/dev/net/tun`` (:func:`missing`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Self

from souq.lifespan import Lifespan
from souq.procs import pid_alive, root_tools_missing, terminate

__all__ = ["NetHost", "Network", "missing", "netns_exec", "sweep"]

TOOLS = ("ip", "iptables", "ip6tables")
# A partition, as (tool, rule): drop what comes in or goes out on any device but loopback (eth0,
# and a delay line's device); a host's traffic to its own address goes over loopback and stays.
# IPv6 (no delay line): what crosses eth0, the host's own and what it forwards (its machines'
# on the private network), not what its machines say to the host itself.
_CUT = (
    ("iptables", "INPUT", "!", "-i", "lo", "-j", "DROP"),
    ("iptables", "OUTPUT", "!", "-o", "lo", "-j", "DROP"),
    ("ip6tables", "INPUT", "-i", "eth0", "-j", "DROP"),
    ("ip6tables", "OUTPUT", "-o", "eth0", "-j", "DROP"),
    ("ip6tables", "FORWARD", "-i", "eth0", "-j", "DROP"),
    ("ip6tables", "FORWARD", "-o", "eth0", "-j", "DROP"),
)
_NAME = re.compile(r"^sq(\d+)(?:h\d+|br|v\d+|t\d+)$")


def missing() -> str | None:
    """Why hosts cannot be built here (not root, a tool missing), or None."""
    lacking = root_tools_missing(
        TOOLS, not_root="network namespaces need root (ip netns, iptables, TUN devices)"
    )
    if lacking:
        return lacking
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing: no delay line between hosts"
    return None


def _cut_rules(host: NetHost, action: str) -> None:
    """Insert (``-I``) or delete (``-D``) the partition's rules in ``host``."""
    for tool, *rule in _CUT:
        host.exec(tool, action, *rule)


def _run(*args: str, check: bool = True) -> str:
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def netns_exec(namespace: str) -> list[str]:
    """The command prefix that runs a command in ``namespace``."""
    return ["ip", "netns", "exec", namespace]


def _kill_namespace(namespace: str) -> None:
    """SIGKILL every process in ``namespace``, then delete it."""
    for word in _run("ip", "netns", "pids", namespace, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(word), signal.SIGKILL)
    _run("ip", "netns", "delete", namespace, check=False)


def sweep(keep: Iterable[int] = ()) -> list[str]:
    """Remove the namespaces and links of runs that are gone (their pid is dead), and return
    their names. ``keep``: pids whose things stay whatever."""
    kept = set(keep)
    removed = []
    for line in _run("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        found = _NAME.match(name)
        if found and int(found[1]) not in kept and not pid_alive(int(found[1])):
            _kill_namespace(name)
            removed.append(name)
    for line in _run("ip", "-o", "link", "show", check=False).splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        found = _NAME.match(name)
        if found and int(found[1]) not in kept and not pid_alive(int(found[1])):
            _run("ip", "link", "delete", name, check=False)
            removed.append(name)
    return removed


@dataclass(frozen=True)
class NetHost:
    """One host: its namespace, its address on the bridge, the root end of its veth."""

    index: int
    namespace: str
    address: str
    veth: str
    address6: str = ""

    def exec(self, *args: str, check: bool = True) -> str:
        """Run a command in this host's namespace."""
        return _run(*netns_exec(self.namespace), *args, check=check)


class Network(Lifespan):
    """``size`` hosts on one bridge, in namespaces made by :meth:`start` (a context manager)."""

    def __init__(self, size: int, *, tag: int | None = None) -> None:
        if not 1 <= size <= 200:
            raise ValueError("between 1 and 200 hosts")
        self.tag = tag if tag is not None else os.getpid()
        prefix = f"sq{self.tag}"
        # A /24 of its own per run (from its tag), in 10.200.0.0/13's neighbourhood.
        net = f"10.{200 + self.tag % 50}.{(self.tag // 50) % 250}"
        self.bridge = f"{prefix}br"
        self.root_address = f"{net}.1"
        net6 = 0xFD5A << 112 | (self.tag & 0xFFFFFFFF) << 80  # a /64 of its own
        self.hosts = [
            NetHost(
                i,
                f"{prefix}h{i}",
                f"{net}.{10 + i}",
                f"{prefix}v{i}",
                str(ipaddress.IPv6Address(net6 | 10 + i)),
            )
            for i in range(size)
        ]
        # (from host, to host): (delay ms, loss %), carried out by a delay line process
        self._paths: dict[tuple[int, int], tuple[float, float]] = {}
        self._line: subprocess.Popen[bytes] | None = None
        self._cut: set[str] = set()
        self.created = False

    # -- making and unmaking -----------------------------------------------------------------

    def start(self) -> Self:
        """The bridge and every host, after sweeping what crashed runs left (and anything left
        under this run's own names)."""
        sweep(keep=[os.getpid()] if self.tag != os.getpid() else [])
        self.stop()
        self.created = True
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.root_address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for host in self.hosts:
            ns = host.namespace
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", f"{host.veth}p")
            _run("ip", "link", "set", f"{host.veth}p", "netns", ns)
            _run("ip", "link", "set", host.veth, "master", self.bridge)
            _run("ip", "link", "set", host.veth, "up")
            host.exec("ip", "link", "set", f"{host.veth}p", "name", "eth0")
            host.exec("ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
            host.exec("ip", "addr", "add", f"{host.address6}/64", "dev", "eth0", "nodad")
            host.exec("ip", "link", "set", "eth0", "up")
            host.exec("ip", "link", "set", "lo", "up")
        return self

    def stop(self) -> None:
        """Every host's namespace (and the processes in it), its veth, and the bridge. Safe to
        call twice, or on a network half made."""
        for host in self.hosts:
            _kill_namespace(host.namespace)
            _run("ip", "link", "delete", host.veth, check=False)
        _run("ip", "link", "delete", self.bridge, check=False)
        self._paths.clear()
        self._stop_line()
        self._cut.clear()
        self.created = False

    # -- partitions --------------------------------------------------------------------------

    def partition(self, host: NetHost) -> None:
        """Cut ``host`` off: drop every packet in or out of its ``eth0``. Its processes run on
        and reach each other (loopback, its own address); nobody else reaches them."""
        if host.namespace not in self._cut:
            _cut_rules(host, "-I")
            self._cut.add(host.namespace)

    def heal(self, host: NetHost) -> None:
        """Undo :meth:`partition`."""
        if host.namespace in self._cut:
            _cut_rules(host, "-D")
            self._cut.discard(host.namespace)

    def partitioned(self, host: NetHost) -> bool:
        return host.namespace in self._cut

    # -- delay and loss --------------------------------------------------------------------

    def shape(
        self,
        source: NetHost,
        towards: Sequence[NetHost],
        *,
        delay_ms: float = 0,
        loss_percent: float = 0,
    ) -> None:
        """What ``source`` sends to ``towards`` is held ``delay_ms`` and dropped with
        ``loss_percent`` % chance (added to what was shaped before: the delay line runs again
        with every path)."""
        for other in towards:
            self._paths[(source.index, other.index)] = (delay_ms, loss_percent)
        self._restart_line()

    def delay(self, group_a: Sequence[NetHost], group_b: Sequence[NetHost], rtt_ms: float) -> None:
        """A round trip between any host of ``group_a`` and any of ``group_b`` takes ``rtt_ms``
        more: half of it each way."""
        self._both_ways(group_a, group_b, rtt_ms / 2, None)

    def loss(self, group_a: Sequence[NetHost], group_b: Sequence[NetHost], percent: float) -> None:
        """Each packet between the two groups is dropped with ``percent`` % chance, each way
        (a delay set before stays)."""
        self._both_ways(group_a, group_b, None, percent)

    def _both_ways(
        self, group_a: Sequence[NetHost], group_b: Sequence[NetHost],
        delay_ms: float | None, loss: float | None,
    ) -> None:  # fmt: skip
        for one, other in ((group_a, group_b), (group_b, group_a)):
            for a in one:
                for b in other:
                    old_delay, old_loss = self._paths.get((a.index, b.index), (0.0, 0.0))
                    self._paths[(a.index, b.index)] = (
                        old_delay if delay_ms is None else delay_ms,
                        old_loss if loss is None else loss,
                    )
        self._restart_line()

    def unshape(self) -> None:
        """No more delay or loss anywhere."""
        self._paths.clear()
        self._stop_line()

    def _restart_line(self) -> None:
        self._stop_line()
        if not self._paths:
            return
        used = sorted({i for pair in self._paths for i in pair})
        spec = {
            "devices": [
                {
                    "host": i,
                    "name": f"sq{self.tag}t{i}",
                    "namespace": self.hosts[i].namespace,
                    "address": self.hosts[i].address,
                }
                for i in used
            ],
            "paths": [[a, b, d, p] for (a, b), (d, p) in sorted(self._paths.items())],
            "seed": self.tag,
        }
        line = subprocess.Popen(
            [sys.executable, "-m", "souq.delayline", json.dumps(spec)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert line.stdout is not None
        if line.stdout.readline().strip() != b"ready":
            err = line.stderr.read().decode(errors="replace") if line.stderr else ""
            line.kill()
            line.wait()
            raise RuntimeError(f"the delay line did not start: {err[-500:]}")
        self._line = line

    def _stop_line(self) -> None:
        if self._line is not None:
            terminate(self._line, timeout=5)
            self._line = None

    def clear_faults(self) -> None:
        """Heal every partition, and no more delay or loss."""
        for host in self.hosts:
            self.heal(host)
        self.unshape()
