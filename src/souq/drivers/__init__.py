"""Drivers run machines: the interface, and the ``exec`` driver (a process in its own session)."""

from souq.drivers.base import Driver, ExitStatus, Handle, MachineSpec, SpawnError
from souq.drivers.exec import ExecDriver

__all__ = ["Driver", "ExecDriver", "ExitStatus", "Handle", "MachineSpec", "SpawnError"]
