"""The worker agent: one per host, the source of truth about its machines.

Pure parts: :mod:`~souq.agent.lifecycle` (the machine state table), :mod:`~souq.agent.operations`
(operation tables) and :mod:`~souq.agent.restart` (restart policy). Edge parts: the SQLite
:mod:`~souq.agent.store`, the :mod:`~souq.agent.executor` that runs operations, the
:mod:`~souq.agent.supervisor`, the bus :mod:`~souq.agent.service` and :mod:`~souq.agent.main`.

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
