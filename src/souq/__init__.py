"""Souq: a cluster orchestrator that schedules like a market."""

__version__ = "0.1.0"

__all__ = ["__version__"]
