"""Where a client finds its token, without loading any cryptography."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FoundToken", "default_dev_dir", "find_token", "locate_token"]


@dataclass(frozen=True)
class FoundToken:
    """A token a client found, and where: ``file`` is the file it was read from (None: it came
    from ``$SOUQ_TOKEN``), so that a broker's refusal can name what to fix."""

    token: str
    file: Path | None = None


def default_dev_dir() -> Path:
    """``souq dev``'s data directory when none is given: ``$SOUQ_DEV_DIR`` when set, else
    ``/var/lib/souq/dev`` for root (its machines run as ``nobody``, who may not enter root's
    home), else ``$XDG_STATE_HOME/souq/dev`` (``~/.local/state/souq/dev``; machines run as the
    same user). The CLI reads that directory's admin token when ``SOUQ_TOKEN`` is unset."""
    if explicit := os.environ.get("SOUQ_DEV_DIR", "").strip():
        return Path(explicit)
    if os.geteuid() == 0:
        return Path("/var/lib/souq/dev")
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "souq" / "dev"


def locate_token() -> FoundToken | None:
    """The token a client sends: ``$SOUQ_TOKEN``, else the admin token of ``souq dev``'s
    default data directory when there is one, else none."""
    if token := os.environ.get("SOUQ_TOKEN", "").strip():
        return FoundToken(token)
    path = default_dev_dir() / "admin.token"
    with contextlib.suppress(OSError):
        if token := path.read_text().strip():
            return FoundToken(token, path)
    return None


def find_token() -> str | None:
    """:func:`locate_token`'s token."""
    found = locate_token()
    return None if found is None else found.token
