"""A worker's end of the routes between workers where the hosts' network is not trusted: a
WireGuard device (:mod:`souq.network.mesh`'s :func:`~souq.network.mesh.wireguard_changes`).

The kernel's WireGuard is used where it has it (``ip link add type wireguard``); elsewhere
WireGuard's own userspace implementation, ``wireguard-go``, makes the device (a TUN device and
a process of its own, which outlives the agent as the device does, so that traffic goes on
while the agent restarts). Either way ``wg`` configures it.

:meth:`WireGuard.start` (at the agent's start): the worker's private key (``wireguard.key`` in
its network directory, made once, mode 0600; its public key goes in the fingerprint), the
device ``sx<tag>wg`` listening on :data:`~souq.network.mesh.WG_PORT`, its MTU the underlay
device's less WireGuard's header. :meth:`WireGuard.peers`: a peer per other worker that has a
key, allowed its /48 only, and the route of its /48 into the device. :meth:`WireGuard.stop`
removes the device (the userspace process ends with it).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from souq.network.mesh import WG_OVERHEAD, WG_PORT, Peer, peers_of, wireguard_changes
from souq.network.overlay import run_tool, underlay_device

__all__ = ["WireGuard", "unavailable"]

log = logging.getLogger(__name__)


def _kernel_has_it() -> bool:
    probe = "sxwgprobe"
    made = subprocess.run(
        ["ip", "link", "add", probe, "type", "wireguard"], capture_output=True, check=False
    )
    if made.returncode == 0:
        run_tool(["ip", "link", "delete", probe], check=False)
    return made.returncode == 0


def unavailable() -> str | None:
    """Why this host cannot make WireGuard devices (None: it can)."""
    if shutil.which("wg") is None:
        return "wg not installed (Debian: apt-get install wireguard-tools)"
    if _kernel_has_it():
        return None
    if shutil.which("wireguard-go") is None:
        return (
            "the kernel has no WireGuard and wireguard-go is not installed "
            "(apt-get install wireguard-go)"
        )
    if not os.path.exists("/dev/net/tun"):
        return "the kernel has no WireGuard and /dev/net/tun is missing (for wireguard-go)"
    return None


class WireGuard:
    """Worker ``worker_id``'s encrypted routes to the other workers, from ``underlay`` (an
    address of this host). ``start()``, ``heard(...)``/``peers(...)``, ``stop()``."""

    def __init__(self, worker_id: str, tag: str, underlay: str, key_dir: Path) -> None:
        self.worker_id = worker_id
        self.underlay = ipaddress.ip_address(underlay).compressed
        self.family = ipaddress.ip_address(underlay).version
        self.device = f"sx{tag}wg"
        self.key_file = key_dir / "wireguard.key"
        self.public_key = ""
        self._now: dict[str, Peer] = {}

    def start(self) -> None:
        why = unavailable()
        if why is not None:
            raise OSError(why)
        found = underlay_device(self.underlay)
        if found is None:
            raise OSError(f"no device of this host has the underlay address {self.underlay}")
        parent, mtu = found
        self.public_key = run_tool(["wg", "pubkey"], self._private_key()).strip()
        if not Path("/sys/class/net", self.device).exists():
            if _kernel_has_it():
                run_tool(["ip", "link", "add", self.device, "type", "wireguard"])
            else:  # it forks itself away and runs as long as its device exists
                run_tool(["wireguard-go", self.device])
        run_tool(["wg", "set", self.device, "private-key", str(self.key_file),
              "listen-port", str(WG_PORT)])  # fmt: skip
        overhead = WG_OVERHEAD + (20 if self.family == 6 else 0)
        run_tool(["ip", "link", "set", self.device, "mtu", str(mtu - overhead), "up"])
        self._now = {}
        log.info("private network: encrypted routes to other workers over %s (%s, %s)",
                 self.underlay, parent, self.device)  # fmt: skip

    def _private_key(self) -> str:
        """The worker's private key, made the first time (only root reads it)."""
        if not self.key_file.exists():
            self.key_file.parent.mkdir(parents=True, exist_ok=True)
            key = run_tool(["wg", "genkey"])
            fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(key)
        return self.key_file.read_text()

    def stop(self) -> None:
        run_tool(["ip", "link", "delete", self.device], check=False)
        self._now = {}

    def heard(self, worker_id: str, underlay: str, key: str = "", link: str = "") -> bool:
        """A worker's heartbeat said where it is reached and its key: its peer as it says
        (``link``: nothing goes straight in clear, so not used)."""
        wanted = dict(self._now)
        wanted.pop(worker_id, None)
        wanted.update(peers_of([(worker_id, underlay, key)], self.worker_id))
        return self.peers(wanted)

    def peers(self, wanted: Mapping[str, Peer]) -> bool:
        """The device's peers and routes as ``wanted`` says (those with a key); whether
        anything changed."""
        keyed = {w: p for w, p in wanted.items() if p.key}
        todo = wireguard_changes(self.device, self._now, keyed)
        if not todo:
            return False
        if todo.remove_ip:
            run_tool(["ip", "-force", "-batch", "-"], "\n".join(todo.remove_ip) + "\n", check=False)
        for args in todo.wg:
            run_tool(["wg", "set", self.device, *args])
        if todo.add_ip:
            run_tool(["ip", "-batch", "-"], "\n".join(todo.add_ip) + "\n")
        self._now = keyed
        routes = ", ".join(f"{p.prefix} via {p.underlay}" for p in keyed.values())
        log.info("private network: encrypted routes to %d other workers (%s)", len(keyed),
                 routes or "none")  # fmt: skip
        return True

    @property
    def routed(self) -> Mapping[str, Peer]:
        return dict(self._now)
