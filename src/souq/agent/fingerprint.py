"""What this host is: hostname, OS, architecture, cpus, memory, disk, gpus, drivers."""

from __future__ import annotations

import os
import platform
import shutil
import socket
from pathlib import Path

import psutil

from souq.agent.config import AgentConfig
from souq.model.worker import Fingerprint

__all__ = ["disk_free_mb", "fingerprint", "host_cpus", "host_memory_mb"]


def fingerprint(
    config: AgentConfig,
    drivers: list[str] | None = None,
    isolation: dict[str, object] | None = None,
    machine_user: str = "",
) -> Fingerprint:
    """The host as detected, with ``cpus``, ``memory_mb``, ``disk_mb`` and ``gpus`` overridden
    by the config. Disk is the free space of the data dir's file system; gpus are 0 unless
    configured, with the configured ``gpu_model`` (no GPU is detected yet)."""
    cpus = config.cpus if config.cpus is not None else host_cpus()
    memory_mb = config.memory_mb if config.memory_mb is not None else host_memory_mb()
    disk_mb = config.disk_mb if config.disk_mb is not None else disk_free_mb(config.data_dir)
    return Fingerprint(
        hostname=socket.gethostname(),
        os=platform.system().lower(),
        arch=platform.machine(),
        cpus=cpus,
        memory_mb=memory_mb,
        disk_mb=disk_mb,
        gpus=config.gpus or 0,
        gpu_model=config.gpu_model if config.gpus else None,
        drivers=drivers or ["exec"],
        isolation=isolation or {"cgroups": "none", "enforced": []},
        machine_user=machine_user,
    )


def host_cpus() -> float:
    """The host's CPU cores, as detected."""
    return float(os.cpu_count() or 1)


def host_memory_mb() -> int:
    """The host's memory in MiB, as detected."""
    return int(psutil.virtual_memory().total // (1024 * 1024))


def disk_free_mb(path: Path) -> int:
    """Free MiB on the file system that holds ``path`` (or its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return int(shutil.disk_usage(probe).free // (1024 * 1024))
    except OSError:
        return 0
