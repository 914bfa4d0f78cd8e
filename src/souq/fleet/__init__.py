"""The hollow fleet (``souq fleet``): many simulated workers in one process, speaking the real
protocol over real NATS, for measuring the control plane at scale."""

from souq.fleet.driver import HollowDriver
from souq.fleet.main import Fleet, FleetConfig, run

__all__ = ["Fleet", "FleetConfig", "HollowDriver", "run"]
