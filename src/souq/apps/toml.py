"""Reading a TOML file so that every error names its line: TOML syntax errors keep the line
tomllib gives, and a value the schema refuses is traced back to the line that set it.

tomllib returns plain data without positions, so :func:`line_of` finds a key's line again by
reading the text as a TOML writer lays it out: ``[table]`` and ``[[array.of.tables]]`` headers,
``key = value`` lines (dotted keys too) and inline tables (``checks = { a = 1 }``: the line of
``checks``). A key it cannot place gets the line of the nearest enclosing key it can.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from souq.errors import InvalidInput

__all__ = ["TomlText", "line_of"]

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_PART = r"""(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""  # a bare or quoted key
_KEY = re.compile(rf"^\s*({_PART}(?:\s*\.\s*{_PART})*)\s*=")
_SYNTAX_LINE = re.compile(r"at line (\d+)")

Loc = Sequence[str | int]


@dataclass(frozen=True)
class TomlText:
    """A TOML document: its text, where it came from, and its data."""

    text: str
    path: str
    data: dict[str, Any]

    @classmethod
    def parse(cls, text: str, path: str) -> TomlText:
        """The document, or :class:`InvalidInput` naming the line of a syntax error."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            found = _SYNTAX_LINE.search(str(exc))
            where = f"{path}:{found.group(1)}" if found else path
            raise InvalidInput(
                f"{where}: not valid TOML: {exc}",
                hint="see https://toml.io for the syntax",
                details={"file": path, "line": int(found.group(1)) if found else None},
            ) from None
        return cls(text, path, data)

    def error(self, loc: Loc, message: str, *, hint: str | None = None) -> InvalidInput:
        """An error about the value at ``loc`` (keys and array indexes), naming its line."""
        key = _dotted(loc)
        line = line_of(self.text, loc)
        where = f"{self.path}:{line}" if line else self.path
        return InvalidInput(
            f"{where}: {key}: {message}" if key else f"{where}: {message}",
            hint=hint,
            details={"file": self.path, "line": line, "field": key},
        )


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _split_key(raw: str) -> list[str]:
    parts = re.findall(r'"[^"]*"|\'[^\']*\'|[^.\s]+', raw)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


def line_of(text: str, loc: Loc) -> int | None:
    """The 1-based line that sets the value at ``loc`` (or the nearest enclosing key), if the
    text is laid out as TOML writers lay it out."""
    want = list(loc)
    best: tuple[int, int] | None = None  # (how much of loc matched, line)
    table: list[str | int] = []
    counts: dict[tuple[str | int, ...], int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header is not None:
            names = _split_key(header.group(2))
            if header.group(1) == "[[":
                key = tuple(names)
                index = counts.get(key, -1) + 1
                counts[key] = index
                table = [*names, index]
            else:
                table = list(names)
            best = _better(best, _matched(want, table), number)
            continue
        key_line = _KEY.match(line)
        if key_line is not None:
            path = [*table, *_split_key(key_line.group(1))]
            best = _better(best, _matched(want, path), number)
    return best[1] if best else None


def _matched(want: list[str | int], path: list[str | int]) -> int:
    """How much of ``want`` the line's ``path`` sets: all of ``path`` must be a prefix of it (or
    ``want`` a prefix of ``path``, a table that holds the value)."""
    n = min(len(want), len(path))
    if want[:n] != path[:n]:
        return 0
    return n if len(path) <= len(want) else 0


def _better(best: tuple[int, int] | None, score: int, line: int) -> tuple[int, int] | None:
    if score and (best is None or score > best[0]):
        return score, line
    return best
