"""Souq on virtual time: the real cores (the broker's auction and book, the worker's admission)
in one process, driven by a :class:`~souq.clock.VirtualClock` instead of a network."""

from souq.sim.cluster import Placed, SimBroker, SimMachine, SimWorker, VirtualCluster

__all__ = ["Placed", "SimBroker", "SimMachine", "SimWorker", "VirtualCluster"]
