"""Every part of a JSON value, by path, and a copy with one part replaced: how the shape tests
(tests/unit/test_model_shapes.py, tests/integration/test_api_fuzz.py) reach every node."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["paths", "put"]


def paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of ``value`` itself (``()``) and of every part of it, depth first."""
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, (*at, i))


def put(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    """A copy of ``value`` with the part at ``at`` replaced by ``new`` (``value`` unchanged)."""
    if not at:
        return new
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    copy[at[0]] = put(value[at[0]], at[1:], new)
    return copy
