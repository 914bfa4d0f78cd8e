"""A worker's private network on its host: a network namespace per machine, joined to the
worker's namespace by a veth pair, and the firewall that keeps networks apart.

Per machine (:meth:`WorkerNetwork.ensure`, before its first spawn, or ahead of its claim for
a sandbox made ahead, :mod:`souq.agent.machines.network_slots`; kept across restarts and
agent restarts; removed by :meth:`WorkerNetwork.remove` at its destroy):

* a namespace ``souq-<tag>-<machine id>`` (``/run/netns``), with ``lo`` up;
* a veth pair: ``eth0`` inside with the machine's ``private_ip/128`` and ``ip4/32``, default
  routes via :data:`GATEWAY6` / :data:`GATEWAY4`; ``sx<tag>m<n>`` outside holding those
  gateway addresses, and the routes ``private_ip/128`` and ``ip4/32`` to it.

Two ``ip -batch`` runs make it (the worker's side, then the machine's), and one
``ip6tables-restore --noflush`` and one ``iptables-restore --noflush`` add its rules (each
table of the family in the one input).

Per worker (:meth:`WorkerNetwork.start`, at the agent's start): forwarding on, the DNS
address :data:`DNS_ADDRESS` on the worker's loopback, a blackhole for the worker's IPv4
block, and the chains ``SOUQ-<tag>-FWD`` (from ``FORWARD``), ``SOUQ-<tag>-IN`` (from
``INPUT``) and ``SOUQ-<tag>-NAT`` (from ``nat POSTROUTING``) for whatever comes from a
machine's link, rebuilt from the live machines. From a machine:

* to a machine of its own network (any worker: a non-contiguous mask of the network bits),
  from its own address only: accepted; to any other ``fdaa::/16`` address: dropped;
* to the worker itself: only the DNS (udp/tcp 53 on ``fdaa::3``: at ``names_port`` there,
  where the cluster's name server answers, DNAT in ``SOUQ-<tag>-FLY``) and ICMPv6 (neighbour
  discovery); replies to what the worker opened (the proxy, checks) pass by conntrack; the
  agent's, NATS's and any other port of the host: dropped;
* to the outside: accepted from its own address (IPv4 masqueraded), except the shared
  address space of other machines and link-local (metadata) addresses.

Flycast (``flycast_port``, 0: off): :data:`PROXY_ADDRESS` on the worker's loopback too, and in
ip6tables' nat table the chain ``SOUQ-<tag>-FLY`` (from ``PREROUTING``, for what comes from a
machine's link), one rule per machine: a TCP connection from its own address to a Flycast
address of its own network is sent to ``[PROXY_ADDRESS]:flycast_port`` (DNAT), where the host's
edge proxy reads the address asked for (``SO_ORIGINAL_DST``), starts the app's machine if it
must, and pipes the connection. ``SOUQ-<tag>-IN`` takes, on that port, what was so sent and
nothing else: a machine connecting to the proxy's port itself is dropped, and another network's
Flycast addresses go the way of any other network's address (dropped).

Edge ports (``edge_host``: the worker's advertise address, IPv4, not loopback; "": none): in
iptables' nat table the chain ``SOUQ-<tag>-EDGE`` (from ``PREROUTING`` and ``OUTPUT``, for TCP
to ``edge_host``), one rule per host port a machine's services the edge routes were given:
sent to the machine's link address and internal port (DNAT). ``SOUQ-<tag>-TO`` takes what was
so sent, in IPv4; a machine's own connection to those ports goes the way of any of its packets
to another machine's link address (dropped). So a proxy of any host that reaches the worker's
address reaches its machines, whatever they listen on (``0.0.0.0`` or ``::``).

The tag is 6 hex digits of the worker id's hash, so several agents on one host keep apart.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from souq.network.addresses import (
    CLUSTER_PREFIX,
    DNS_ADDRESS,
    DNS_PORT,
    FLYCAST_PORT,
    GATEWAY4,
    GATEWAY6,
    PROXY_ADDRESS,
    V4_RANGE,
    PrivateAddress,
    flycast_mask,
    network_bits,
    network_mask,
    v4_block,
)
from souq.network.fastpath import FastPath, MachineLink
from souq.network.mesh import VXLAN_PORT

__all__ = ["NETNS_DIR", "WorkerNetwork", "unavailable"]

log = logging.getLogger(__name__)

NETNS_DIR = Path("/run/netns")
DNS_DEVICE = "lo"
TOOLS = ("ip", "iptables-restore", "ip6tables-restore", "iptables", "ip6tables")


def _run(args: list[str], stdin: str | None = None, *, check: bool = True) -> str:
    done = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise OSError(f"{' '.join(args[:3])}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def unavailable() -> str | None:
    """Why this host cannot give machines a private network (None: it can)."""
    if os.geteuid() != 0:
        return "a private network needs root (network namespaces, ip6tables)"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"{', '.join(absent)} not installed (Debian: apt-get install iproute2 iptables)"
    for tool in ("iptables", "ip6tables"):
        done = subprocess.run([tool, "-w", "-S", "FORWARD"], capture_output=True, check=False)
        if done.returncode != 0:
            return f"{tool} cannot read the filter table here"
    return None


def host_addresses() -> None:
    """The host's addresses every machine is given: the names' :data:`DNS_ADDRESS` and the
    proxy's :data:`PROXY_ADDRESS` (Flycast), on loopback (every kernel has it, not every one
    has dummy devices). Made again at will."""
    for address in (DNS_ADDRESS, PROXY_ADDRESS):
        _run(["ip", "addr", "replace", f"{address}/128", "dev", DNS_DEVICE, "nodad"])


@dataclass(frozen=True)
class _Names:
    netns: str
    link: str


def worker_tag(worker_id: str) -> str:
    """What names a worker's namespaces (``souq-TAG-…``), links (``sxTAGm…``), chains
    (``SOUQ-TAG-…``) and table (``souq-TAG``) on its host."""
    return hashlib.blake2b(worker_id.encode(), digest_size=3).hexdigest()


class WorkerNetwork:
    def __init__(
        self,
        worker_id: str,
        state_dir: Path,
        *,
        flycast_port: int = FLYCAST_PORT,
        edge_host: str = "",
        names_port: int = DNS_PORT,
    ) -> None:
        self.tag = worker_tag(worker_id)
        self.v4 = v4_block(worker_id)
        self.resolv_conf = state_dir / "resolv.conf"
        self._state_dir = state_dir
        self.flycast_port = flycast_port
        self.edge_host = edge_host
        self.names_port = names_port
        self.fwd, self.inp, self.nat, self.into, self.fly, self.edge = (
            f"SOUQ-{self.tag}-{c}" for c in ("FWD", "IN", "NAT", "TO", "FLY", "EDGE")
        )
        self._edges: dict[str, tuple[tuple[int, int], ...]] = {}  # the edge rules made
        self.links = f"sx{self.tag}m+"  # every machine link of this worker
        self.fast = FastPath(self.tag)  # between machines of two workers (its docstring)

    def names(self, machine_id: str, address: PrivateAddress) -> _Names:
        index = int(ipaddress.IPv4Address(address.ip4)) - int(self.v4.network_address)
        return _Names(f"souq-{self.tag}-{machine_id}", f"sx{self.tag}m{index:03x}")

    def fast_link(self, machine_id: str, address: PrivateAddress) -> MachineLink:
        """The machine as the fast path sees it."""
        return MachineLink(self.names(machine_id, address).link, address.ip6, address.network)

    def netns_path(self, machine_id: str, address: PrivateAddress) -> Path:
        return NETNS_DIR / self.names(machine_id, address).netns

    # -- the worker ----------------------------------------------------------------------------

    def start(self, live: Iterable[tuple[str, PrivateAddress]]) -> None:
        """Forwarding, the DNS address, the chains rebuilt for ``live`` machines, and what
        machines gone since left behind removed."""
        live = list(live)
        self._edges = {m: a.edge for m, a in live}
        self._state_dir.mkdir(parents=True, exist_ok=True)
        self.resolv_conf.write_text(f"nameserver {DNS_ADDRESS}\noptions ndots:0\n")
        for path in ("ipv6/conf/all/forwarding", "ipv4/ip_forward"):
            Path("/proc/sys/net", path).write_text("1\n")
        host_addresses()
        _run(["ip", "route", "replace", "unreachable", str(self.v4)])
        for family, rules in (("ip6", self._rules6(live)), ("ip", self._rules4(live))):
            _run([f"{family}tables-restore", "-w", "--noflush"], rules)
            self._jump(family)
        names = [self.names(m, a) for m, a in live]
        self.sweep({n.netns for n in names}, {n.link for n in names})
        fast = [self.fast_link(m, a) for m, a in live]
        self.fast.start(f for f in fast if Path("/sys/class/net", f.link).exists())

    def _jumps(self, family: str) -> list[tuple[str, str, list[str]]]:
        """``(table, chain, rule)`` of each jump to the worker's chains."""
        jumps = [
            ("filter", "FORWARD", ["-i", self.links, "-j", self.fwd]),
            ("filter", "FORWARD", ["!", "-i", self.links, "-o", self.links, "-j", self.into]),
            ("filter", "INPUT", ["-i", self.links, "-j", self.inp]),
        ]
        if family == "ip":
            jumps.append(("nat", "POSTROUTING", ["-j", self.nat]))
            if self.edge_host:
                to_edge = ["-d", f"{self.edge_host}/32", "-p", "tcp", "-j", self.edge]
                jumps += [("nat", "PREROUTING", to_edge), ("nat", "OUTPUT", to_edge)]
        else:
            jumps.append(("nat", "PREROUTING", ["-i", self.links, "-j", self.fly]))
        return jumps

    def _jump(self, family: str) -> None:
        tool = f"{family}tables"
        for table, chain, spec in self._jumps(family):
            check = [tool, "-w", "-t", table, "-C", chain, *spec]
            if subprocess.run(check, capture_output=True, check=False).returncode != 0:
                _run([tool, "-w", "-t", table, "-I", chain, "1", *spec])

    def stop_rules(self) -> None:
        """Remove the worker's chains and its block's route (an agent leaving with no machine
        running; tests, benchmarks)."""
        _run(["ip", "route", "del", "unreachable", str(self.v4)], check=False)
        self.fast.stop()
        for family in ("ip", "ip6"):
            tool = f"{family}tables"
            for table, chain, spec in self._jumps(family):
                _run([tool, "-w", "-t", table, "-D", chain, *spec], check=False)
            nat = (self.nat, self.edge) if family == "ip" else (self.fly,)
            for table, target in (
                ("filter", self.fwd), ("filter", self.into), ("filter", self.inp),
                *(("nat", chain) for chain in nat),
            ):  # fmt: skip
                _run([tool, "-w", "-t", table, "-F", target], check=False)
                _run([tool, "-w", "-t", table, "-X", target], check=False)

    def _rules6(self, live: list[tuple[str, PrivateAddress]]) -> str:
        inputs = [
            "-p ipv6-icmp -j ACCEPT",
            *(
                f"-d {DNS_ADDRESS}/128 -p {proto} --dport {self.names_port} -j ACCEPT"
                for proto in ("udp", "tcp")
            ),
        ]
        if self.flycast_port:  # only what a machine's Flycast rule sent there
            inputs.append(
                f"-d {PROXY_ADDRESS}/128 -p tcp --dport {self.flycast_port} "
                "-m conntrack --ctstate DNAT -j ACCEPT"
            )
        lines = self._filter(6, live, [], self._machine6, inputs)
        lines += ["*nat", f":{self.fly} - [0:0]"]
        lines += [f"-A {self.fly} {r}" for m, a in live for r in self._flycast(m, a)]
        if self.names_port != DNS_PORT:  # the names of this worker's cluster, at their port
            lines += [
                f"-A {self.fly} -d {DNS_ADDRESS}/128 -p {proto} --dport {DNS_PORT} "
                f"-j DNAT --to-destination [{DNS_ADDRESS}]:{self.names_port}"
                for proto in ("udp", "tcp")
            ]
        lines.append("COMMIT")
        return "\n".join(lines) + "\n"

    def _rules4(self, live: list[tuple[str, PrivateAddress]]) -> str:
        guards = [f"-d {V4_RANGE} -j DROP", "-d 169.254.0.0/16 -j DROP"]
        lines = self._filter(4, live, guards, self._machine4, [])
        lines += [
            "*nat",
            f":{self.nat} - [0:0]",
            f"-A {self.nat} -s {self.v4} ! -o {self.links} -j MASQUERADE",
            f":{self.edge} - [0:0]",
            *(f"-A {self.edge} {r}" for m, a in live for r in self._edge(a)),
            "COMMIT",
        ]
        return "\n".join(lines) + "\n"

    def _filter(
        self,
        family: int,
        live: list[tuple[str, PrivateAddress]],
        guards: list[str],
        machine: Callable[[str, PrivateAddress], list[str]],
        inputs: list[str],
    ) -> list[str]:
        """The filter table of one family: the chain into machines; the forward chain (replies,
        no VXLAN from a machine, the family's ``guards``, each live machine's own rules, then
        drop); the input chain (replies, the family's ``inputs``, then drop)."""
        return [
            "*filter",
            f":{self.fwd} - [0:0]",
            f":{self.inp} - [0:0]",
            *self._into(family, live),
            f"-A {self.fwd} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
            f"-A {self.fwd} -p udp --dport {VXLAN_PORT} -j DROP",
            *(f"-A {self.fwd} {r}" for r in guards),
            *(f"-A {self.fwd} {r}" for m, a in live for r in machine(m, a)),
            f"-A {self.fwd} -j DROP",
            f"-A {self.inp} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
            *(f"-A {self.inp} {r}" for r in inputs),
            f"-A {self.inp} -j DROP",
            "COMMIT",
        ]

    def _into(self, family: int, live: list[tuple[str, PrivateAddress]]) -> list[str]:
        """The chain of what comes to a machine from beyond the worker (another worker's
        machines over the routes between workers): from its own network only, or replies.
        What comes from a machine of this worker was judged by its own chain."""
        lines = [
            f":{self.into} - [0:0]",
            f"-A {self.into} -i {self.links} -j RETURN",
            f"-A {self.into} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        ]
        if family == 6:
            lines += [f"-A {self.into} {r}" for m, a in live for r in self._into6(m, a)]
        elif self.edge_host:  # what the edge rules sent to a machine
            lines.append(f"-A {self.into} -m conntrack --ctstate DNAT -j ACCEPT")
        return [*lines, f"-A {self.into} -j DROP"]

    def _into6(self, machine_id: str, a: PrivateAddress) -> list[str]:
        link = self.names(machine_id, a).link
        return [f"-o {link} -d {a.ip6}/128 -s {network_mask(network_bits(a.network))} -j ACCEPT"]

    def _machine6(self, machine_id: str, a: PrivateAddress) -> list[str]:
        link = self.names(machine_id, a).link
        own = f"-i {link} -s {a.ip6}/128"
        return [
            f"{own} -d {network_mask(network_bits(a.network))} -j ACCEPT",
            f"{own} ! -d {CLUSTER_PREFIX} -j ACCEPT",
        ]

    def _flycast(self, machine_id: str, a: PrivateAddress) -> list[str]:
        """Its TCP connections to its own network's Flycast addresses: to the host's proxy."""
        if not self.flycast_port:
            return []
        link = self.names(machine_id, a).link
        return [
            f"-i {link} -s {a.ip6}/128 -d {flycast_mask(a.network)} -p tcp "
            f"-j DNAT --to-destination [{PROXY_ADDRESS}]:{self.flycast_port}"
        ]

    def _edge(self, a: PrivateAddress) -> list[str]:
        """Its host ports at the edge host: to its link address's internal ports."""
        if not self.edge_host:
            return []
        return [
            f"-p tcp --dport {outer} -j DNAT --to-destination {a.ip4}:{inner}"
            for outer, inner in a.edge
        ]

    def _machine4(self, machine_id: str, a: PrivateAddress) -> list[str]:
        return [f"-i {self.names(machine_id, a).link} -s {a.ip4}/32 -j ACCEPT"]

    # -- machines ------------------------------------------------------------------------------

    def exists(self, machine_id: str, address: PrivateAddress) -> bool:
        names = self.names(machine_id, address)
        return (NETNS_DIR / names.netns).exists() and Path("/sys/class/net", names.link).exists()

    def ensure(self, machine_id: str, address: PrivateAddress) -> Path:
        """The machine's namespace, made unless it is there whole; its path."""
        names = self.names(machine_id, address)
        if self.exists(machine_id, address):
            self._refresh_edge(machine_id, address)
            return NETNS_DIR / names.netns
        if (NETNS_DIR / names.netns).exists() or Path("/sys/class/net", names.link).exists():
            self._remove(names)  # half made (an agent killed meanwhile)
        ns, link = names.netns, names.link
        outside = [
            f"netns add {ns}",
            f"link add {link} type veth peer name eth0 netns {ns}",
            f"link set {link} addrgenmode none",
            f"addr add {GATEWAY6}/64 dev {link} nodad",
            f"addr add {GATEWAY4}/32 dev {link}",
            f"link set {link} up",
            f"route add {address.ip6}/128 dev {link}",
            f"route add {address.ip4}/32 dev {link}",
        ]
        inside = [
            "link set lo up",
            "link set eth0 addrgenmode none",
            f"addr add {address.ip6}/128 dev eth0 nodad",
            f"addr add {address.ip4}/32 dev eth0",
            "link set eth0 up",
            f"route add default via {GATEWAY6} dev eth0",
            f"route add {GATEWAY4}/32 dev eth0 scope link",
            f"route add default via {GATEWAY4} dev eth0",
        ]
        try:
            _run(["ip", "-batch", "-"], "\n".join(outside) + "\n")
            _run(["ip", "-n", ns, "-batch", "-"], "\n".join(inside) + "\n")
            self._to_loopback(ns, address)
            if machine_id in self._edges:  # its rules are made (at the worker's start)
                self._refresh_edge(machine_id, address)
            else:
                self._machine_rules(machine_id, address, "-I")
        except OSError:
            self._remove(names)
            raise
        self._edges[machine_id] = address.edge
        return NETNS_DIR / ns

    def started(self, machine_id: str, address: PrivateAddress) -> None:
        """The machine has started: its fast path entry, in the background (the kernel's route
        and the chains carry its traffic until then: :mod:`souq.network.fastpath`)."""
        self.fast.add_later(self.fast_link(machine_id, address))

    def leave(self, running: Iterable[tuple[str, PrivateAddress]]) -> list[str]:
        """The agent goes away: the namespaces of its machines that do not run are removed
        (a start makes them again, with the same addresses), and with none running the
        worker's chains too (the next agent's start makes them again): nothing is left of
        a worker without running machines. The names of the namespaces removed."""
        running = list(running)
        keep = [self.names(m, a) for m, a in running]
        gone = self.sweep({n.netns for n in keep}, {n.link for n in keep})
        self.fast.close()
        if not running:
            self.stop_rules()
            self._edges.clear()
        return gone

    @staticmethod
    def _to_loopback(ns: str, address: PrivateAddress) -> None:
        """Inside the machine's namespace: TCP over IPv4 to its link address goes to its
        loopback (DNAT, ``route_localnet`` on ``eth0``), so that a program listening on
        ``127.0.0.1``, as ``PORT`` has always said, is reached by the proxy and the checks,
        as one listening on ``0.0.0.0`` or ``::`` is. Over IPv6 (the private network)
        nothing changes: a program meant for other machines listens on ``::``."""
        inside = ["ip", "netns", "exec", ns]
        _run([*inside, "sysctl", "-qw", "net.ipv4.conf.eth0.route_localnet=1"])
        rule = (
            f"-A PREROUTING -i eth0 -d {address.ip4}/32 -p tcp -j DNAT --to-destination 127.0.0.1"
        )
        _run([*inside, "iptables-restore", "-w"], f"*nat\n{rule}\nCOMMIT\n")

    def _refresh_edge(self, machine_id: str, address: PrivateAddress) -> None:
        """Its edge rules as its record now says (an update changed its services)."""
        made = self._edges.get(machine_id)
        if made == address.edge:
            return
        for rules, how in ((self._edge(replace(address, edge=made or ())), "-D"),
                           (self._edge(address), "-I")):  # fmt: skip
            if rules:
                where = " 1" if how == "-I" else ""
                body = "".join(f"{how} {self.edge}{where} {rule}\n" for rule in rules)
                _run(["iptables-restore", "-w", "--noflush"], f"*nat\n{body}COMMIT\n")
        self._edges[machine_id] = address.edge

    def _machine_rules(self, machine_id: str, address: PrivateAddress, how: str) -> None:
        """Insert (``-I``, after the chains' heads) or delete (``-D``) its rules: one
        ``-restore`` per family, its tables one after the other in its input."""
        inputs: dict[str, dict[str, str]] = {"ip6": {}, "ip": {}}
        for family, table, chain, rules, after in (
            ("ip6", "filter", self.fwd, self._machine6(machine_id, address), 2),
            ("ip6", "filter", self.into, self._into6(machine_id, address), 2),
            ("ip6", "nat", self.fly, self._flycast(machine_id, address), 0),
            ("ip", "filter", self.fwd, self._machine4(machine_id, address), 4),
            ("ip", "nat", self.edge, self._edge(address), 0),
        ):
            where = f" {after + 1}" if how == "-I" else ""
            body = "".join(f"{how} {chain}{where} {rule}\n" for rule in rules)
            if body:
                tables = inputs[family]
                tables[table] = tables.get(table, "") + body
        for family, tables in inputs.items():
            if tables:
                text = "".join(f"*{t}\n{body}COMMIT\n" for t, body in tables.items())
                _run([f"{family}tables-restore", "-w", "--noflush"], text)

    def remove(self, machine_id: str, address: PrivateAddress) -> None:
        """The machine's namespace, links, routes and rules, gone."""
        made = self._edges.pop(machine_id, address.edge)
        self.fast.remove(self.fast_link(machine_id, address))
        with contextlib.suppress(OSError):
            self._machine_rules(machine_id, replace(address, edge=made), "-D")
        self._remove(self.names(machine_id, address))

    def _remove(self, names: _Names) -> None:
        _run(["ip", "netns", "delete", names.netns], check=False)  # its eth0, and the pair
        _run(["ip", "link", "delete", names.link], check=False)

    def sweep(self, live_netns: set[str], live_links: set[str]) -> list[str]:
        """Namespaces and links of this worker whose machine is gone: removed; their names."""
        gone: list[str] = []
        prefix = f"souq-{self.tag}-"
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(NETNS_DIR):
                if name.startswith(prefix) and name not in live_netns:
                    _run(["ip", "netns", "delete", name], check=False)
                    gone.append(name)
        pattern = re.compile(rf"^sx{self.tag}m[0-9a-f]+$")
        for name in os.listdir("/sys/class/net"):
            if pattern.match(name) and name not in live_links:
                _run(["ip", "link", "delete", name], check=False)
                gone.append(name)
        if gone:
            log.info("private network: removed what gone machines left: %s", ", ".join(gone))
        return gone
