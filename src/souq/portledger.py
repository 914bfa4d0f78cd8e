"""Loopback ports for the servers one host starts side by side, with no two given out at once.

A server started for a test or for ``souq dev`` is given a free port first and binds it a moment
later (once its process is up). A port the kernel picks (a bind to port 0) is free at the pick,
but nothing stops another process from being given the same one before the bind: with many
processes starting servers at once (a test run in several worker processes, each starting
clusters) that happens. So, where ``SOUQ_PORT_LEDGER`` names a directory, the ports come from
a ledger kept there instead, which every process of the host that names it shares:

* :func:`free_port` hands out :data:`LEDGER_PORTS` round-robin (a counter in a file, taken under
  ``flock``), skipping a port something listens on. The range lies below the kernel's ephemeral
  ports (32768 and up), so no outgoing connection and no kernel-picked port lands in it, and
  below the agents' host ports (:data:`souq.dev.PORT_BLOCKS`); a port comes round again only
  after the other 9,999.
* :func:`next_block` numbers the blocks of host ports agents are started with, the same way, so
  that agents started by different processes never share one.

Without the variable, :func:`free_port` asks the kernel, as one process alone can."""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import socket
from pathlib import Path

__all__ = ["LEDGER_ENV", "LEDGER_PORTS", "free_port", "ledger", "next_block"]

LEDGER_ENV = "SOUQ_PORT_LEDGER"
LEDGER_PORTS = (10000, 19999)


def ledger() -> Path | None:
    """The ledger's directory, when ``SOUQ_PORT_LEDGER`` names one."""
    where = os.environ.get(LEDGER_ENV)
    return Path(where) if where else None


def take_turn(path: Path, modulo: int) -> int:
    """The counter in ``path`` (0 to ``modulo - 1``), advanced by one for the next taker, under
    an exclusive lock. A new counter starts at a random place, so that ledgers of different
    users do not walk the same ports in step."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        turn = int(text) % modulo if text.isdigit() else secrets.randbelow(modulo)
        data = f"{(turn + 1) % modulo}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        return turn
    finally:
        os.close(fd)  # closing drops the lock


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing on ``host`` listens on, for a server about to start there: the
    ledger's next free one, else one the kernel picks."""
    where = ledger()
    if where is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port: int = s.getsockname()[1]
            return port
    low, high = LEDGER_PORTS
    size = high - low + 1
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    for _ in range(size):
        port = low + take_turn(where / "ports", size)
        if _bindable(port, host):
            return port
    raise OSError(errno.EADDRINUSE, f"every port of the ledger's {low}-{high} is in use")


def next_block(count: int) -> int | None:
    """The next of ``count`` blocks of agents' host ports from the ledger, or None without
    one (the caller numbers its own)."""
    where = ledger()
    if where is None:
        return None
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    return take_turn(where / "agent-port-blocks", count)
