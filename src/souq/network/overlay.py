"""A worker's end of the routes between workers (:mod:`souq.network.mesh`): its VXLAN device,
the entries and routes of its peers, and the filter on what reaches the device.

:meth:`Overlay.start` (at the agent's start) makes the device ``sx<tag>vx`` (``local`` the
worker's underlay address, :data:`~souq.network.mesh.VXLAN_PORT`, no learning), its MAC and
link-local address the worker's own, its MTU the underlay device's less the VXLAN header, and
the chain ``SOUQ-<tag>-MESH`` (jumped to from ``INPUT`` for UDP to the VXLAN port, in
``iptables`` or ``ip6tables`` as the underlay is): VXLAN from a known peer's underlay address
only, so that nobody else puts frames on the cluster's network. :meth:`Overlay.peers`
converges the peers' entries and routes on what the heartbeats now say (a peer whose IPv6
underlay address is on one of the underlay device's subnets is routed to straight; one whose
IPv4 address is on one of its IPv4 subnets and that published its device's link-local address
is a link peer, routed straight via that address under ``--underlay-link direct``, and under
``auto`` once :meth:`Overlay.proved` says a probe of that path was answered:
:mod:`souq.network.link_probes` runs them), and the chain with them. Publishing its
link-local, the worker holds its own probe address (:func:`~souq.network.mesh.probe_address`)
on ``lo``, deprecated so that the kernel never picks it as a source of its own, for the link
peers' probes to be answered. :meth:`Overlay.stop` removes the device (its entries and routes
go with it), the routes out of the underlay device, the probe address and the chain.

Several agents on one host would each need a port of their own: one underlay address and port
make one device.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from souq.network.fastpath import FastPath, hops_of
from souq.network.mesh import (
    PROBE_INTERVAL_S,
    VNI,
    VXLAN_OVERHEAD,
    VXLAN_PORT,
    LinkProbe,
    Peer,
    UnderlayLink,
    changes,
    gateway_of,
    mac_of,
    mesh_rules,
    next_probe_at,
    over_link,
    peers_of,
    probe_address,
    probes_due,
)

__all__ = ["Overlay", "on_link_subnets", "run_tool", "underlay_device"]

log = logging.getLogger(__name__)


def run_tool(args: list[str], stdin: str | None = None, *, check: bool = True) -> str:
    """Run ``ip``, ``iptables-restore``, ``wg`` ...: its output; OSError naming it when it fails
    (``check``)."""
    done = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise OSError(f"{' '.join(args[:3])}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def underlay_device(address: str) -> tuple[str, int] | None:
    """The device holding ``address`` on this host, and its MTU; None: no device has it."""
    family = "-6" if ipaddress.ip_address(address).version == 6 else "-4"
    for line in run_tool(["ip", "-o", family, "addr", "show"], check=False).splitlines():
        words = line.split()
        if len(words) > 3 and words[3].split("/")[0] == address:
            device = words[1].split("@")[0]
            mtu = Path("/sys/class/net", device, "mtu").read_text().strip()
            return device, int(mtu)
    return None


def _mtu(device: str) -> int:
    try:
        return int(Path("/sys/class/net", device, "mtu").read_text())
    except (OSError, ValueError):
        return 0


Subnet = ipaddress.IPv4Network | ipaddress.IPv6Network


def on_link_subnets(device: str, family: int = 6) -> list[Subnet]:
    """The subnets ``device`` is on (its addresses' prefixes; of IPv6, the global and
    unique-local ones)."""
    subnets: list[Subnet] = []
    shown = run_tool(["ip", "-o", f"-{family}", "addr", "show", "dev", device], check=False)
    for line in shown.splitlines():
        words = line.split()
        if len(words) > 3 and words[2] in ("inet", "inet6"):
            subnet = ipaddress.ip_interface(words[3]).network
            if not subnet.is_link_local and subnet.prefixlen < subnet.max_prefixlen:
                subnets.append(subnet)
    return subnets


def link_local(device: str) -> str:
    """The IPv6 link-local address of ``device`` (empty: it has none, IPv6 being off there)."""
    shown = run_tool(["ip", "-o", "-6", "addr", "show", "dev", device, "scope", "link"],
                     check=False)  # fmt: skip
    for line in shown.splitlines():
        words = line.split()
        if len(words) > 3 and words[2] == "inet6":
            return words[3].split("/")[0]
    return ""


class Overlay:
    """Worker ``worker_id``'s routes to the other workers, over ``underlay`` (an address of
    this host). ``start()``, ``peers(...)`` as often as they change, ``stop()``."""

    def __init__(
        self,
        worker_id: str,
        tag: str,
        underlay: str,
        fast: FastPath | None = None,
        *,
        link: UnderlayLink = "vxlan",
    ) -> None:
        """``link``: what to do with peers on this host's IPv4 link that publish a link-local
        address (``--underlay-link``): straight once probed (``auto``), straight
        (``direct``), over VXLAN (``vxlan``: and this worker publishes none)."""
        self.worker_id = worker_id
        self.link_mode: UnderlayLink = link
        self.link_local = ""  # what this worker publishes for them (set at the start)
        self.probe_source = probe_address(worker_id)
        self._probes: dict[str, LinkProbe] = {}  # the last probe of each link peer's path
        self._why: dict[str, str] = {}  # why each peer goes the way it goes (logged anew)
        # Why link peers go over VXLAN before any probe answered (no prober: said here).
        self.unprobed = "not probed yet"
        self._can_probe = False
        self.fast = fast  # told the routes too (souq.network.fastpath)
        self.underlay = ipaddress.ip_address(underlay).compressed
        self.family = ipaddress.ip_address(underlay).version
        self.device = f"sx{tag}vx"
        self.chain = f"SOUQ-{tag}-MESH"
        self._tool = "ip6tables" if self.family == 6 else "iptables"
        self._now: dict[str, Peer] = {}
        self.parent = ""  # the underlay's device
        # its subnets: peers on them are direct (IPv6; IPv4 when link_direct)
        self._link: list[Subnet] = []

    # -- the device --------------------------------------------------------------------------

    def start(self) -> None:
        """The device made anew (whatever a previous agent left is replaced), and its chain."""
        found = underlay_device(self.underlay)
        if found is None:
            raise OSError(f"no device of this host has the underlay address {self.underlay}")
        parent, mtu = found
        self.parent = parent
        self._link = on_link_subnets(parent)
        if self.link_mode != "vxlan" and self.family == 4:
            self.link_local = link_local(parent)
            if self.link_local:
                self._link += on_link_subnets(parent, 4)
                run_tool(["ip", "addr", "replace", f"{self.probe_source}/128", "dev", "lo",
                          "nodad", "preferred_lft", "0"])  # fmt: skip
                self._can_probe = shutil.which("ping") is not None
                if self.link_mode == "auto" and not self._can_probe:
                    self.unprobed = "ping (Debian: iputils-ping) is not installed: no probe"
                    log.warning("private network: %s: VXLAN to every worker", self.unprobed)
            else:
                log.warning("private network: %s has no IPv6 link-local address: no "
                            "--underlay-link %s, VXLAN to every worker", parent,
                            self.link_mode)  # fmt: skip
        overhead = VXLAN_OVERHEAD + (20 if self.family == 6 else 0)
        if not self._made_as(parent):  # else kept: traffic between workers goes on
            self._make(parent, mtu - overhead)
        self._now = {}
        self._rules()
        self._fast()
        spec = ["-p", "udp", "--dport", str(VXLAN_PORT), "-j", self.chain]
        check = [self._tool, "-w", "-C", "INPUT", *spec]
        if subprocess.run(check, capture_output=True, check=False).returncode != 0:
            run_tool([self._tool, "-w", "-I", "INPUT", "1", *spec])
        log.info("private network: routes to other workers over %s (%s)", self.underlay, parent)

    def _made_as(self, parent: str) -> bool:
        """Whether the device is there as :meth:`_make` makes it (an agent's before)."""
        shown = run_tool(["ip", "-j", "-d", "link", "show", "dev", self.device], check=False)
        try:
            (link,) = json.loads(shown or "[]")
            data = link["linkinfo"]["info_data"]
        except (ValueError, KeyError, TypeError):
            return False
        local = data.get("local") or data.get("local6") or ""
        return (
            data.get("id") == VNI
            and data.get("port") == VXLAN_PORT
            and local == self.underlay
            and link.get("address") == mac_of(self.worker_id)
            and data.get("link") == parent
            and "UP" in link.get("flags", [])
        )

    def _make(self, parent: str, mtu: int) -> None:
        run_tool(["ip", "link", "delete", self.device], check=False)
        run_tool(
            [
                "ip", "link", "add", self.device, "type", "vxlan", "id", str(VNI),
                "local", self.underlay, "dstport", str(VXLAN_PORT), "nolearning", "dev", parent,
            ]
        )  # fmt: skip
        batch = [
            f"link set {self.device} address {mac_of(self.worker_id)} mtu {mtu}",
            f"link set {self.device} addrgenmode none",
            f"addr add {gateway_of(self.worker_id)}/64 dev {self.device} nodad",
            f"link set {self.device} up",
        ]
        run_tool(["ip", "-batch", "-"], "\n".join(batch) + "\n")

    def stop(self) -> None:
        """The device, its peers' entries and routes, the probe address and the chain: gone."""
        straight = changes(self.device, self.parent, self._now, {}).remove_ip
        if straight:  # the routes out of the underlay device (the device's go with it)
            run_tool(["ip", "-force", "-batch", "-"], "\n".join(straight) + "\n", check=False)
        if self.link_local:
            run_tool(["ip", "addr", "del", f"{self.probe_source}/128", "dev", "lo"], check=False)
        run_tool(["ip", "link", "delete", self.device], check=False)
        spec = ["-p", "udp", "--dport", str(VXLAN_PORT), "-j", self.chain]
        run_tool([self._tool, "-w", "-D", "INPUT", *spec], check=False)
        run_tool([self._tool, "-w", "-F", self.chain], check=False)
        run_tool([self._tool, "-w", "-X", self.chain], check=False)
        self._now, self._probes, self._why = {}, {}, {}
        if self.fast is not None:
            self.fast.route([])

    # -- the peers ---------------------------------------------------------------------------

    def heard(self, worker_id: str, underlay: str, key: str = "", link: str = "") -> bool:
        """A worker's heartbeat said where it is reached (empty: nowhere) and, taking its
        machines' traffic straight over its IPv4 link, its link-local address there
        (``link``): its peer entry as it says, the others as they were, its path due to be
        probed again; whether anything changed."""
        wanted = dict(self._now)
        wanted.pop(worker_id, None)
        probe = self._probes.get(worker_id)
        if probe is not None:
            self._probes[worker_id] = replace(probe, recheck=True)
        found = peers_of([(worker_id, underlay, key)], self.worker_id, self.on_link)
        wanted.update((wid, self._way(peer, link)) for wid, peer in found.items())
        return self.peers(wanted)

    def _way(self, peer: Peer, link: str) -> Peer:
        """``peer`` as it is to be routed (:func:`~souq.network.mesh.over_link`); the reason
        logged when it changed."""
        routed, why = over_link(
            peer,
            link,
            mode=self.link_mode,
            own_link=self.link_local,
            on_link=self.on_link,
            probe=self._probes.get(peer.worker_id),
            unprobed=self.unprobed,
        )
        if self.family == 4 and self._why.get(peer.worker_id) != why:
            self._why[peer.worker_id] = why
            how = f"straight via {routed.link} on {self.parent}" if routed.direct else "over VXLAN"
            probe = self._probes.get(peer.worker_id)
            unanswered = bool(routed.link and not routed.direct and probe and not probe.answered)
            log.log(logging.WARNING if unanswered else logging.INFO,
                    "private network: worker %s (%s) %s: %s", peer.worker_id, peer.underlay,
                    how, why)  # fmt: skip
        return routed

    # -- the probes of link peers (souq.network.link_probes runs them) -----------------------

    @property
    def probing(self) -> bool:
        """Whether link peers' paths are to be probed (``auto``, a link-local published, and
        ``ping`` at hand)."""
        return self.link_mode == "auto" and bool(self.link_local) and self._can_probe

    def probes_due(self, now: float, interval_s: float = PROBE_INTERVAL_S) -> list[Peer]:
        return probes_due(self._now, self._probes, now, interval_s) if self.probing else []

    def next_probe_at(self, interval_s: float = PROBE_INTERVAL_S) -> float | None:
        return next_probe_at(self._now, self._probes, interval_s) if self.probing else None

    def proved(self, worker_id: str, link: str, answered: bool, at: float) -> bool:
        """A probe of the path to ``worker_id`` over the link to ``link`` was answered or not,
        at ``at``: its /48 routed accordingly (a probe of a link it no longer publishes
        changes nothing); whether anything changed."""
        peer = self._now.get(worker_id)
        if peer is None or peer.link != link:
            return False
        before = self._probes.get(worker_id)
        failures = 0 if answered else (before.failures if before else 0) + 1
        self._probes[worker_id] = LinkProbe(link, at, answered, failures)
        base = replace(peer, direct=False, link="")
        return self.peers({**self._now, worker_id: self._way(base, link)})

    def peers(self, wanted: Mapping[str, Peer]) -> bool:
        """Entries, routes and the filter as ``wanted`` says (peers of the underlay's family
        only); whether anything changed."""
        usable = {
            w: p
            for w, p in wanted.items()
            if ipaddress.ip_address(p.underlay).version == self.family
        }
        todo = changes(self.device, self.parent, self._now, usable)
        if not todo:
            return False
        # Removals may name what is already gone: each line tried on its own.
        for tool, lines in (("ip", todo.remove_ip), ("bridge", todo.remove_bridge)):
            if lines:
                run_tool([tool, "-force", "-batch", "-"], "\n".join(lines) + "\n", check=False)
        for tool, lines in (("bridge", todo.add_bridge), ("ip", todo.add_ip)):
            if lines:
                run_tool([tool, "-batch", "-"], "\n".join(lines) + "\n")
        self._now = dict(usable)
        for gone in set(self._probes) - set(usable):
            del self._probes[gone]
        for gone in set(self._why) - set(usable):
            del self._why[gone]
        self._rules()
        self._fast()
        log.info(
            "private network: routes to %d other workers (%s)",
            len(usable),
            ", ".join(
                f"{p.prefix} via {p.next_hop if p.direct else p.underlay}"
                f"{'' if p.direct else ' (vxlan)'}"
                for p in usable.values()
            )
            or "none",
        )
        return True

    def on_link(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        """Whether ``address`` is on the underlay device's own link."""
        return any(address in subnet for subnet in self._link if subnet.version == address.version)

    @property
    def routed(self) -> Mapping[str, Peer]:
        return dict(self._now)

    def _fast(self) -> None:
        """The fast path's routes as the kernel's now are (IPv6 peers: straight out of the
        underlay device; the others: into the VXLAN device)."""
        if self.fast is None:
            return
        # An IPv4 underlay has IPv6 on its device only for link peers (one routed over VXLAN
        # from here may send straight: its packets come in there too).
        straight = self.family == 6 or any(p.direct or p.link for p in self._now.values())
        parent = self.parent if straight else ""
        self.fast.route(
            hops_of(self._now, parent, _mtu(self.parent), self.device, _mtu(self.device))
        )

    def _rules(self) -> None:
        body = mesh_rules(self.chain, self._now.values(), self.family)
        run_tool([f"{self._tool}-restore", "-w", "--noflush"], body)
