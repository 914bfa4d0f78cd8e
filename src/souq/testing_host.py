"""What the tests' workers leave on the host, found and removed: the private networks of
agents that did not leave them (killed, or gone with machines left running), and the
machines (with their souq-waiters) an agent left running when it stopped."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

__all__ = ["forget_networks", "kill_left_machines"]


def forget_networks(worker_ids: Iterable[str]) -> None:
    """What the private networks of ``worker_ids`` left on this host when their agents did not
    leave them (killed, or gone with machines left running): their machines' namespaces and
    links, their chains and tables. What the host holds is read once, and only the workers
    that left something are cleaned (some twenty commands each). Nothing where the host has
    no private networks."""
    from souq.network import links

    if links.unavailable() is not None:
        return
    held = _network_names()
    for worker_id in worker_ids:
        tag = links.worker_tag(worker_id)
        if held is None or any(
            mark in held for mark in (f"souq-{tag}", f"SOUQ-{tag}-", f"sx{tag}m")
        ):
            with contextlib.suppress(OSError):
                links.WorkerNetwork(worker_id, Path("/nonexistent")).leave([])


def _network_names() -> str | None:
    """The names of the host's network namespaces, links, iptables chains and nft tables, as
    one text (None: one of them could not be read)."""
    from souq.network import links

    try:
        names = [*os.listdir(links.NETNS_DIR)] if links.NETNS_DIR.exists() else []
        names += os.listdir("/sys/class/net")
        for command in (["iptables-save"], ["ip6tables-save"], ["nft", "list", "tables"]):
            names.append(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    except (OSError, subprocess.CalledProcessError):
        return None
    return "\n".join(names)


def kill_left_machines(data_dir: Path) -> None:
    """The machines an agent of ``data_dir`` left running (it was killed, or stopped with
    ``stop_machines_on_exit=False``), and their souq-waiters: killed, as their pid files name
    them. A pid whose start time is not the one recorded is another process now: left be."""
    from souq.drivers import processes
    from souq.drivers.exec import RECORDS

    for pidfile in (data_dir / "machines" / RECORDS).glob("*/pid"):
        with contextlib.suppress(OSError, ValueError):
            words = pidfile.read_text().split()
            for pid, started in zip(words[0::2], words[1::2], strict=False):
                if processes.start_time(int(pid)) == float(started):
                    processes.kill_group(int(pid))
