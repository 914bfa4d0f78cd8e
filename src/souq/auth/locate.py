"""Where a client finds its token, without loading any cryptography."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["default_dev_dir", "find_token"]


def default_dev_dir() -> Path:
    """``souq dev``'s data directory when none is given: ``/var/lib/souq/dev`` for root (its
    machines run as ``nobody``, who may not enter root's home), else
    ``$XDG_STATE_HOME/souq/dev`` (``~/.local/state/souq/dev``; machines run as the same user)."""
    if os.geteuid() == 0:
        return Path("/var/lib/souq/dev")
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "souq" / "dev"


def find_token() -> str | None:
    """The token a client sends: ``$SOUQ_TOKEN``, else the admin token of ``souq dev``'s
    default data directory when there is one, else none."""
    if token := os.environ.get("SOUQ_TOKEN", "").strip():
        return token
    with contextlib.suppress(OSError):
        return (default_dev_dir() / "admin.token").read_text().strip() or None
    return None
