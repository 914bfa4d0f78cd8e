"""The sockets a machine's process listens on, as its own network namespace has them.

psutil reads a process's connections from ``/proc/net/*``, the tables of the *caller's*
network namespace: a machine in a namespace of its own (the private network) would show
nothing. ``/proc/<pid>/net/*`` are the tables of the process's own namespace; a socket of the
process is one whose inode one of its descriptors names (``socket:[INODE]``).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

__all__ = ["listening"]

# (file under /proc/<pid>/net, proto as ps shows it, the states that count: TCP's LISTEN,
# UDP's unconnected "close" state, 07).
_TABLES = (
    ("tcp", "tcp", "0A", 4),
    ("tcp6", "tcp6", "0A", 6),
    ("udp", "udp", "07", 4),
    ("udp6", "udp6", "07", 6),
)


def _inodes(pid: int) -> set[str]:
    found: set[str] = set()
    fds = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fds):
        try:
            target = os.readlink(fds / fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def _address(hex_address: str, version: int) -> tuple[str, int]:
    """``0100007F:1F90`` → ``("127.0.0.1", 8080)``: the kernel's words, each little-endian."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.IPv4Address(words) if version == 4 else ipaddress.IPv6Address(words)
    return ip.compressed, int(port, 16)


def listening(pid: int) -> tuple[tuple[str, str, int], ...]:
    """``(proto, host, port)`` of each socket ``pid`` listens on (TCP) or has bound unconnected
    (UDP), in its own network namespace; :class:`OSError` where its tables cannot be read."""
    inodes = _inodes(pid)
    out: list[tuple[str, str, int]] = []
    for table, proto, state, version in _TABLES:
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in that namespace, say
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == state and fields[9] in inodes:
                out.append((proto, *_address(fields[1], version)))
    return tuple(out)
