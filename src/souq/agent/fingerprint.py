"""What this host is: hostname, OS, architecture, cpus, memory, drivers."""

from __future__ import annotations

import os
import platform
import socket

import psutil

from souq.agent.config import AgentConfig
from souq.model.resources import Resources
from souq.model.worker import Fingerprint

__all__ = ["capacity_of", "fingerprint"]


def fingerprint(config: AgentConfig, drivers: list[str] | None = None) -> Fingerprint:
    """The host as detected, with ``cpus`` and ``memory_mb`` overridden by the config."""
    cpus = config.cpus if config.cpus is not None else float(os.cpu_count() or 1)
    memory_mb = (
        config.memory_mb
        if config.memory_mb is not None
        else int(psutil.virtual_memory().total // (1024 * 1024))
    )
    return Fingerprint(
        hostname=socket.gethostname(),
        os=platform.system().lower(),
        arch=platform.machine(),
        cpus=cpus,
        memory_mb=memory_mb,
        drivers=drivers or ["exec"],
    )


def capacity_of(fp: Fingerprint) -> Resources:
    return Resources(cpus=fp.cpus, memory_mb=fp.memory_mb)
