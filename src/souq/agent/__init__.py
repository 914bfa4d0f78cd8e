"""The worker agent: one per host, the source of truth about its machines.

Pure parts: :mod:`~souq.agent.machines.lifecycle` (the machine state table),
:mod:`~souq.agent.state.operations` (operation tables) and :mod:`~souq.agent.machines.restart`
(restart policy). Edge parts: the SQLite :mod:`~souq.agent.state.store`, the
:mod:`~souq.agent.machines.executor` that runs operations, the
:mod:`~souq.agent.machines.supervisor`, the bus :mod:`~souq.agent.service` and
:mod:`~souq.agent.main`.

The exports load lazily, so importing a pure module never pulls in the I/O ones.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from souq.agent.config import AgentConfig
    from souq.agent.main import Agent, run, serve

__all__ = ["Agent", "AgentConfig", "run", "serve"]

_WHERE = {
    "Agent": "souq.agent.main",
    "AgentConfig": "souq.agent.config",
    "run": "souq.agent.main",
    "serve": "souq.agent.main",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'souq.agent' has no attribute {name!r}")
