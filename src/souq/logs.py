"""Log lines as text (the default) or as JSON objects, one per line (``--log-format json``).

Fields bound with :func:`log_context` (or :func:`bind`) — ``request_id``, ``machine_id``,
``app``, ``worker_id`` — are added to every line logged inside that context (contextvars: each
asyncio task sees its own), in both formats' JSON and as the ``extra`` of a call.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal

__all__ = ["JsonFormatter", "LogFormat", "bind", "configure", "current", "log_context"]

LogFormat = Literal["text", "json"]
FIELDS = ("request_id", "app", "machine_id", "worker_id")

_context: ContextVar[dict[str, str]] = ContextVar("souq_log_context", default={})  # noqa: B039


def current() -> dict[str, str]:
    return dict(_context.get())


def bind(**fields: str | None) -> None:
    """Add fields to the current context until it ends (e.g. for the rest of a request's task)."""
    _context.set({**_context.get(), **{k: v for k, v in fields.items() if v}})


@contextmanager
def log_context(**fields: str | None) -> Iterator[None]:
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items() if v}})
    try:
        yield
    finally:
        _context.reset(token)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_context.get())
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(fmt: LogFormat = "text", level: int = logging.INFO) -> None:
    """The root logger writes to stderr in ``fmt``."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
